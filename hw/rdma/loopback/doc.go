// Package loopback is an in-process implementation of the rdma contract:
// regions are hostmem blocks, a write is a memcpy between them, and each
// sending node has a link that models bandwidth and latency. It is the
// embedded default, the sim's data path and the test double for real
// transports, so it keeps the contract's hard parts real: completion is
// asynchronous, a write lands no later than its batch completes, and a closed
// endpoint lands nothing more. Faults are not its business: wrap it with
// hw/rdma/rdmafault, as any transport.
//
// The life of a batch, file by file:
//
//	endpoint.go  Post checks every write against the registered regions
//	             (a NIC's protection check) and refuses a closed endpoint
//	             or a gone peer. On an unmodeled link without hooks (the
//	             embedded default) it copies the bytes at once and queues
//	             only the completion for the link goroutine (postDirect):
//	             no batch record, clock or per-endpoint lock is shared
//	             with that goroutine, and it is signalled only when it
//	             waits, so a stream of batches costs one lock per batch
//	             on the cache line the two goroutines share. The rest of
//	             this list is the modeled path.
//	link.go      The sending node's link stamps the batch: it starts when
//	             the link is free, occupies it for its modeled bytes at the
//	             modeled rate (Options.Slow may hold it longer), and lands
//	             a latency later: its modeled instant.
//	endpoint.go  Post reads the sources now, the strictest test of
//	             write-before-read: into a staging buffer (staging.go), or
//	             straight into the destination when the batch lands at
//	             once (an unmodeled link: a memcpy transport's work is the
//	             copy, and doing it on the poster's thread spares every
//	             batch a hand-off, which on two cores costs more than a
//	             64 KiB copy, docs/TRANSPORT-BENCH.md) or when its copy
//	             must start now to be in place by its instant.
//	link.go      The link goroutine copies staged batches into their
//	             destinations a measured lead ahead of their instants, in
//	             landing order, and runs each batch's done at its instant:
//	             the emulator's memcpy is not charged to modeled time
//	             (BatchSpan reports it apart).
//	endpoint.go  Close fails every batch not yet reported and waits for a
//	             copy under way: after it returns nothing of the endpoint
//	             lands. transport.go's Close does the same for every
//	             endpoint of the node and for other nodes' copies into it.
//	access.go    A peer access point (rdma.PeerAccessor) is one more name on
//	             the fabric that resolves to the node; Revoke removes the
//	             name and closes, as above, every endpoint connected
//	             through it, so that it always quiesces.
package loopback
