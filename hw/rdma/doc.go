// Package rdma defines kvstream's transport contract, shaped for real RDMA
// rather than for Go slices: memory is registered and described to a peer by
// (address, length, key); a write names a local address and a remote address
// plus key; writes are posted in batches that complete asynchronously; and
// completion means the bytes are visible at the destination (UCX: after a
// flush; verbs: a signaled RC completion).
//
// Optional parts, which a caller finds by a type assertion (and, through a
// wrapper, by an error marked ErrUnsupported): PeerAccessor (an access point
// per peer, revoked before the memory that peer could write is reused),
// Allocator (memory the transport allocates in the form its fastest path
// needs) and TypedRegistrar (registration that says the memory's type, so
// that device memory takes the device paths); RegisterMemory uses the last
// one when offered.
//
// Implementations: hw/rdma/loopback (in-process, the default and the test
// double) and hw/rdma/ucx (libucx through cgo, build tag ucx). Any of them
// can be wrapped by hw/rdma/rdmafault to inject faults.
package rdma
