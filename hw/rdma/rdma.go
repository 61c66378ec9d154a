package rdma

import "github.com/cockroachdb/errors"

// RegionDesc is what a peer needs to write into registered memory. It is
// plain data, sent over the control plane.
type RegionDesc struct {
	Addr uint64 // address of the region's first byte, in the owner's address space
	Len  uint64
	Key  []byte // packed remote key; opaque to everyone but the transport
}

// LocalKey names a region registered on this side, as the source of writes.
type LocalKey uint32

// RemoteKey names a peer region imported into one endpoint.
type RemoteKey uint32

// Write is one contiguous remote write.
type Write struct {
	Src    uint64 // local address, inside the region of Local
	Dst    uint64 // remote address, inside the region of Remote
	Len    uint64
	Local  LocalKey
	Remote RemoteKey
}

// Transport is one side's access to the fabric.
type Transport interface {
	// Name is a short name for logs ("loopback", "ucx").
	Name() string
	// Address is this side's worker address, for peers that Connect to it.
	Address() []byte
	// Register makes [addr, addr+length) writable by peers and readable as a
	// write source. The memory must not move: mmap or device memory, never
	// the Go heap.
	Register(addr, length uint64) (Region, error)
	// Connect opens an endpoint to the peer whose Address is addr.
	Connect(addr []byte) (Endpoint, error)
	// Close closes every endpoint and region and releases the transport.
	Close() error
}

// Region is registered local memory.
type Region interface {
	// Desc describes the region to a peer.
	Desc() RegionDesc
	// Key names the region as a write source.
	Key() LocalKey
	// Deregister releases the registration.
	Deregister() error
}

// Endpoint is a connection to one peer. Its methods are safe for concurrent
// use.
type Endpoint interface {
	// Import prepares a peer's region for writes on this endpoint.
	Import(d RegionDesc) (RemoteKey, error)
	// Post starts the writes as one batch and returns at once; the caller may
	// reuse ws afterwards. done runs exactly once, never inside Post, on a
	// transport goroutine: with nil when every write is visible at the
	// destination, or with the batch's error. When Post itself returns an
	// error, nothing of the batch was started and done is never called.
	Post(ws []Write, done func(error)) error
	// Close tears the endpoint down: batches not yet completed fail, and when
	// Close returns no write posted on this endpoint can land any more
	// (invariant 10 rests on this). A transport that cannot
	// guarantee that (UCX over TCP or shared memory emulates puts with
	// messages the receiver applies; if the peer stalls they may still be
	// applied later) returns an error marked ErrNotQuiesced: the destination
	// pages of those writes must not be reused. The batches such a Close
	// fails report errors marked ErrNotQuiesced as well, so that their
	// owners learn it even when someone else closed the endpoint. Where
	// the receiver fences, both are marked ErrFenced too: the writes stop
	// landing once a batch posted afterwards to the same peer landed (UCX
	// message writes to an access point, whose connection broke).
	Close() error
}

// ErrEndpointBroken marks errors after which an endpoint is unusable (peer
// gone, torn down, transport error). A fresh endpoint may succeed.
var ErrEndpointBroken = errors.New("rdma: endpoint broken")

// ErrNotQuiesced marks a teardown after which writes may still land.
var ErrNotQuiesced = errors.New("rdma: writes may still land")

// ErrFenced marks, together with ErrNotQuiesced, a teardown whose writes
// stop landing once a batch posted afterwards through the same Transport
// to the same peer Address completed without error: the receiver fences
// (it refuses every write older than the newest it applied). A caller that
// goes on writing to that peer may count the destination pages of the
// torn-down writes quiet once such a batch completed; one that stops
// before must treat them as not quiesced. hw/rdma/ucx's message writes to
// an access point are fenced this way.
var ErrFenced = errors.New("rdma: writes may still land until a later batch to the same peer lands")

// ErrRevoked marks, together with ErrEndpointBroken, a batch the peer
// refused on purpose: it revoked this side's access, or refused a write to
// memory it does not hold. A fresh endpoint would be refused the same way:
// callers that re-send on broken endpoints do not re-send these.
var ErrRevoked = errors.New("rdma: the peer refused the writes")

// ErrInvalidWrite marks a write outside registered memory or naming an
// unknown key: a bug in the caller's addresses, never retried.
var ErrInvalidWrite = errors.New("rdma: invalid write")

// PeerAccessor is implemented by transports that can give each peer an
// access point of its own, so that one peer's access to this side's
// registered memory can be revoked while other peers go on. A decode
// server offers each prefill session its own access point and revokes it
// before the memory that session could write is reused or unmapped.
type PeerAccessor interface {
	// OpenPeerAccess opens an access point for one peer. Every region
	// registered on the transport is writable through it (with the keys of
	// its RegionDesc), until Revoke.
	OpenPeerAccess() (PeerAccess, error)
}

// LostPeerRevoker is implemented by access points that can cut off a peer
// that stopped answering without tearing its connections down, where a
// transport cannot do that safely with a peer that does not answer (UCX
// 1.13 aborts destroying a worker whose connection setup with a stopped
// peer is pending). RevokeLost answers as Revoke does; what it keeps may
// stay until the process exits. Callers that know the peer is lost call it
// instead of Revoke when the access point offers it.
type LostPeerRevoker interface {
	RevokeLost() error
}

// PeerAccess is one peer's way in to this side's registered memory.
type PeerAccess interface {
	// Address is what the peer Connects to (in place of the transport's
	// Address).
	Address() []byte
	// Revoke cuts the access point off. When it returns nil, no write a
	// peer posted through it can land any more, and later writes fail at
	// the sender (its endpoint breaks). When the transport cannot confirm
	// that (the peer writes this memory directly: shared memory it mapped,
	// cross-memory attach), Revoke still cuts what it can and returns an
	// error marked ErrNotQuiesced: memory the peer could write must then
	// never be reused or unmapped while this process lives. A second
	// Revoke returns the first one's result.
	Revoke() error
}

// ErrUnsupported marks a call to an optional part of the contract
// (PeerAccessor, Allocator) that this transport, or the transport a wrapper
// wraps, does not offer. Callers fall back to the mandatory part.
var ErrUnsupported = errors.New("rdma: not supported by this transport")

// Allocator is implemented by transports that can allocate memory for peers
// to write, registered as they allocate it and in the form their fastest
// path needs: UCX allocates through ucp_mem_map, which a peer on the same
// host maps, so that its put is one memcpy (memory registered by Register
// is reached through a slower path there). Memory someone else owns (a GPU
// pool, the serving stack's host memory) still goes through Register.
type Allocator interface {
	// Allocate returns length bytes of zeroed host memory, registered like
	// a Region of Register. It is released by its Free, or by the
	// transport's Close.
	Allocate(length uint64) (Allocation, error)
}

// Allocation is memory a transport allocated and registered.
type Allocation interface {
	Region
	// Bytes is the memory; Desc().Addr is the address of its first byte.
	// It must not be used after Free or the transport's Close.
	Bytes() []byte
	// Free deregisters and releases the memory; Deregister does the same.
	// Memory a peer could write must not be freed while that peer may
	// still write it: only after every PeerAccess it could write through
	// was revoked with a nil answer (never after an ErrNotQuiesced one),
	// and the endpoints that could write it through the transport's own
	// Address closed; or leave it to the transport's Close, which releases
	// it once nothing can land. Batches that read it as a source must have
	// completed. A second Free, or a Free after Close, does nothing.
	Free() error
}

// MemoryType is the kind of memory a region lives in.
type MemoryType uint8

const (
	// MemoryHost is host memory (mmap'd, never the Go heap).
	MemoryHost MemoryType = iota
	// MemoryCUDA is CUDA device memory (a cuMemAlloc'd pointer).
	MemoryCUDA
)

// String names the memory type.
func (m MemoryType) String() string {
	switch m {
	case MemoryHost:
		return "host"
	case MemoryCUDA:
		return "cuda"
	}
	return "unknown"
}

// TypedRegistrar is implemented by transports that take the memory's type
// at registration rather than detecting it, so that they pick their path
// for it (UCX: cuda_ipc on one host, GPUDirect RDMA across hosts for CUDA
// memory, instead of treating a device pointer as host memory).
type TypedRegistrar interface {
	// RegisterTyped is Register of memory of type mt.
	RegisterTyped(addr, length uint64, mt MemoryType) (Region, error)
}

// RegisterMemory registers [addr, addr+length) of type mt on t: through
// RegisterTyped when t offers it, else through Register (which then takes
// the memory as it finds it: the loopback tells device memory by its
// Options.ReadDevice).
func RegisterMemory(t Transport, addr, length uint64, mt MemoryType) (Region, error) {
	if tr, ok := t.(TypedRegistrar); ok {
		return tr.RegisterTyped(addr, length, mt)
	}
	return t.Register(addr, length)
}
