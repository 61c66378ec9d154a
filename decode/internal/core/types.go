package core

import (
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
)

// The values the core shares with the serving stack: package decode
// re-exports them under the same names (type aliases), so that each has
// one definition.

// Buffer is one KV tensor of the decode pool, in memory that never moves
// (pinned host memory or device memory the transport can register). The
// pool has one Buffer per prefill buffer, in the prefill's order (the order
// of the engine's Config.Buffers on the prefill side), each with the same
// ItemLen; Pages may differ from the prefill's.
type Buffer struct {
	Name    string // for logs and errors
	Base    uint64 // address of page 0
	ItemLen uint64 // bytes of ONE page of this buffer
	Pages   int    // capacity in pages
	// Memory is the kind of memory the buffer lives in (host by default):
	// the server registers device memory as such (rdma.RegisterMemory).
	Memory rdma.MemoryType
	// Region, if set, is the buffer's registration already: memory the
	// transport allocated (rdma.Allocator; registering it again would lose
	// what it is for, as UCX's shared-memory fast path). The server offers
	// it as is and never deregisters it: its owner frees it once the
	// server released the pool (Config.Free, Close).
	Region rdma.Region
}

// PrefillBuffer is one prefill buffer as a Hello describes it: what the
// decode pool's buffer of the same index must match.
type PrefillBuffer struct {
	Name    string
	Layer   int
	ItemLen uint64
	Pages   uint64 // the prefill buffer's capacity; a pool sized by Config.Size may use it
}

// Chunk is one chunk notice the prefill sent for a room: the status its
// Finish (or Drop) returned, once its bytes landed.
type Chunk struct {
	Room       uint64
	Start, End int  // tokens [Start, End) of the request
	Last       bool // the room's last chunk
	Status     messages.Status
	// Err is the prefill's error text for a chunk that did not succeed.
	Err string
	// NotQuiesced: the prefill could not guarantee that the failed chunk's
	// writes stopped.
	NotQuiesced bool
	Bytes       uint64
	// Positions are the request positions (pages of the request) the chunk
	// wrote, DstPages their decode pages, in the same order.
	Positions, DstPages []int
}

// Room is what Wait reports: the room's pages (as Expected; nil for a room
// created by AcceptUnknownRooms) and the chunks the prefill reported, in
// order.
type Room struct {
	ID       uint64
	Pages    []int
	Chunks   []Chunk
	Complete bool // the last chunk succeeded, and every chunk before it
}

// SessionReport is how a prefill session ended.
type SessionReport struct {
	Prefill string // the prefill's name
	// Chunks counts the notices accepted; Failed those not successful,
	// refused or rejected by Verify.
	Chunks, Failed int
	// Rooms counts the rooms the session completed.
	Rooms int
	// Complete: the prefill said goodbye having sent all it meant to,
	// every notice it sent arrived and succeeded, every room it started
	// completed, and it reported at least one chunk.
	Complete bool
	// Empty: the session reported nothing (a Hello and a goodbye): it
	// completed nothing and verified nothing.
	Empty bool
}
