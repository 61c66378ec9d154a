// Command embed is the smallest complete use of kvstream's prefill engine,
// written only against public packages so that it can be copied out of the
// module: an engine on simulated hardware (a virtual GPU and the in-process
// loopback fabric) streams one request's KV, layer group by layer group,
// into a decode pool, and checks every byte.
//
// README.md shows the heart of main, from system.New to Finish: a test
// (TestReadmeSnippet) keeps the README's Go block an excerpt of this file.
package main
