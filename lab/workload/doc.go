// Package workload is `kvstream sim`: a prefill engine and a decode pool in
// one process (virtual GPU, loopback transport with a modeled link), a batch
// of requests run through chunked prefill forwards, streamed per layer group
// and, for comparison, sent monolithically after each forward. It checks
// every owned destination page against its source and reports TTFT, exposed
// transfer time, the theoretical floor, submits per forward and bandwidth,
// and can draw the run as a trace and a picture.
package workload
