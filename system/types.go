package system

import (
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
)

// The values a serving stack passes in and gets back. They are defined in
// lower packages (the actors use them too) and named here so that a user of
// the façade needs no other import.
type (
	// Result is a chunk context's outcome: its key, Status, Stats and, when
	// it failed, the error (marked with its class, see the Err* values).
	Result = messages.Result
	// Status is how a chunk ended: Succeeded, Failed or Dropped.
	Status = messages.Status
	// ChunkStats are a chunk's transfer figures (bytes, batches, instants).
	ChunkStats = messages.Stats
	// Peer is a decode session this engine writes to: its id, its
	// transport address and its buffers in the prefill layout's order.
	// Pass it to AddPeer before registering chunks that name it.
	Peer = plan.Peer
	// Sharding is one side's layout of the model's KV cache (a reshard.Side:
	// layers, KV heads, head dim, dtype, MLA, TP, PP stages, page size and
	// order) and its rank: Config.Sharding for this prefill rank,
	// Peer.Sharding for a decode rank. Both optional.
	Sharding = plan.Sharding
	// PeerBuffer is one decode buffer of a Peer: its registered region
	// (address, length, packed key) and its item length (bytes per page).
	PeerBuffer = plan.PeerBuffer
	// ChunkSpec is what the scheduler registers before the forward that
	// writes tokens [Start, End) of a room: the prefill pages backing the
	// chunk (SrcPages, in position order), the request's page count and the
	// room's decode destinations (Infos).
	ChunkSpec = plan.ChunkSpec
	// DecodeInfo is one decode destination of a room: the peer, the full
	// request's destination page list (position p goes to DstPages[p]),
	// and whether it is a dummy that receives nothing.
	DecodeInfo = plan.DecodeInfo
	// Mode is how a room is sent: PerLayer or Monolithic.
	Mode = cp.Mode
	// Reason says why the register guard chose a mode.
	Reason = cp.Reason
)

// Statuses and modes.
const (
	Succeeded  = messages.Succeeded
	Failed     = messages.Failed
	Dropped    = messages.Dropped
	PerLayer   = cp.PerLayer
	Monolithic = cp.Monolithic
)

// Registration is what Register returns.
type Registration struct {
	Mode     Mode
	Reason   Reason // why the guard chose Mode
	Existing bool   // the chunk was already registered: nothing changed
	Chunk    messages.Chunk
}
