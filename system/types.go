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
	// Result is a chunk context's outcome, as Finish returns it:
	//
	//	Chunk    the chunk: Room, Start, End (its exact range), Epoch, Serial
	//	PerLayer whether it was streamed per layer (else monolithic)
	//	Status   Succeeded, Failed or Dropped
	//	Err      why it did not succeed, marked with its class (the Err* values)
	//	Stats    its transfer figures (ChunkStats)
	Result = messages.Result
	// Chunk identifies one chunk context: its room, exact token range and
	// the serial of its registration.
	Chunk = messages.Chunk
	// Status is how a chunk ended: Succeeded, Failed or Dropped.
	Status = messages.Status
	// ChunkStats are a chunk's transfer figures:
	//
	//	Bytes, Blocks, Batches  bytes, contiguous writes and batches posted
	//	Groups, Ignored         groups accepted from its forward; duplicates ignored
	//	FirstPost, LastDone     when its first write was posted, its last one landed
	//	ForwardEnd              when its forward ended (zero if it never did)
	//	EventWait               time submitters waited on its events
	//	Exposed                 Finish's return minus ForwardEnd: what the forward did not hide
	ChunkStats = messages.Stats
	// Peer is a decode pool this engine writes to. Pass it to AddPeer
	// before registering chunks that name it; decode.Client.Peer (or
	// Attach) gives it for a decode server in another process.
	//
	//	ID      the name DecodeInfo.Peer refers to
	//	Address the decode transport's worker address (rdma.Transport.Address)
	//	Buffers one PeerBuffer per prefill buffer, in Config.Buffers' order
	Peer = plan.Peer
	// Sharding is one side's layout of the model's KV cache (a reshard.Side:
	// layers, KV heads, head dim, dtype, MLA, TP, PP stages, page size and
	// order) and its rank: Config.Sharding for this prefill rank,
	// Peer.Sharding for a decode rank. Both optional.
	Sharding = plan.Sharding
	// PeerBuffer is one decode buffer of a Peer:
	//
	//	Region  its registration on the decode side: Addr, Len, Key (packed remote key)
	//	ItemLen bytes of one page; must equal the prefill buffer's (without Sharding)
	PeerBuffer = plan.PeerBuffer
	// ChunkSpec is what the scheduler registers before the forward that
	// writes tokens [Start, End) of a room:
	//
	//	Room       the request's transfer id, shared with the decode side
	//	Start, End tokens; Start page-aligned, End floored to a page unless Last
	//	Last       the request's last chunk
	//	SrcPages   the prefill pages backing the chunk, in position order (a
	//	           trailing partial page of a non-last chunk goes with the next)
	//	TotalPages the request's page count (the contiguous CP rule needs it;
	//	           when set it is checked against the chunk and the destinations)
	//	Infos      the room's decode destinations (DecodeInfo)
	ChunkSpec = plan.ChunkSpec
	// DecodeInfo is one decode destination of a room:
	//
	//	Peer     the ID of a Peer added with AddPeer
	//	DstPages the whole request's decode pages: position p goes to DstPages[p]
	//	Dummy    a destination that receives nothing
	DecodeInfo = plan.DecodeInfo
	// Mode is how a room is sent: PerLayer or Monolithic.
	Mode = cp.Mode
	// Reason says why the register guard chose a mode.
	Reason = cp.Reason
)

// Statuses and modes.
const (
	// RestSeq is the Seq of a batch that is no group's: what the end of the
	// forward sends (buffers no hook covers, groups that never fired, or
	// everything when monolithic). See Batch.
	RestSeq    = messages.Rest
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
