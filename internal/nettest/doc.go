// Package nettest gives tests TCP addresses where nothing listens and
// nothing else can start to.
//
// The usual way, listening on port 0 and closing the listener, frees the
// port at once: a node another test (or the process under test) starts on
// port 0 may be given it, and a dial that was to find nothing listening
// finds that node, and the test fails on an answer it did not expect. A
// socket bound to the port, and never listening, keeps the port (on Linux
// and the BSDs): the kernel refuses a connection to it, and gives it to no
// other bind to port 0 and to no connection as its source port.
package nettest
