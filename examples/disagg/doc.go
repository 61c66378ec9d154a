// Command disagg is disaggregated serving in miniature, written only against
// public packages so that it can be copied out of the module: a decode loop
// (allocate pages, expect the room, wait for it, use the pages) and a
// prefill loop (a scheduler registering chunks, a forward loop calling
// LayerEnd, a transfer worker calling Finish per chunk and telling the
// decode side) stream three requests' KV, layer group by layer group.
//
// In production the two loops run in two processes on two machines, each
// with its own decode.Node, over RDMA (hw/rdma/ucx). Here they share one
// process, one node (a process should have only one) and the in-process
// loopback fabric, on a virtual GPU.
package main
