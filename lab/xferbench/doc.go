// Package xferbench measures put bandwidth through an rdma.Transport the
// way the engine's submitters use it: regions on both sides (allocated by
// the transports, rdma.Allocator, or hostmem blocks registered), writes
// posted through rdma.Endpoint.Post with a window of batches in flight,
// completion meaning "visible at the destination", every destination byte
// checked after every run, and optionally, alternating with the runs, a
// plain memcpy of the same bytes and UCX's own ucx_perftest ucp_put_bw
// (launched as a server and a client process) with the same size and
// count.
//
// `kvstream bench transport` is its command line (flags map one to one onto
// Config, and Config's errors name those flags); tests and Go benchmarks
// open a Rig directly. docs/TRANSPORT-BENCH.md has the method and the
// figures.
package xferbench
