package messages

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// ChunkKey names a chunk the way the serving stack does: its room and the
// exact token range [Start, End) its forward writes (End page-floored unless
// it is the last chunk). Registering an active key again is a no-op.
//
// An empty range (a forward that wrote less than a page of the request)
// repeats when consecutive forwards each write less than a page, so its key
// also carries Epoch, the number of forwards begun when it was registered:
// re-registrations while one batch forms share it, the next forward's chunk
// does not.
type ChunkKey struct {
	Room       uint64
	Start, End int
	Epoch      uint64
}

// Chunk identifies one chunk context: its key plus a serial unique within an
// engine, because a key that finished and is registered again is a new
// context whose messages must never mix with the old one's.
type Chunk struct {
	ChunkKey
	Serial uint64
}

// Event is the fence a group's writes wait on: a CUDA event recorded after
// the group's last layer was enqueued. hw/cuda.Event satisfies it.
type Event interface {
	Wait(ctx context.Context) error
}

// Passed is an event the device has passed already: a Work re-sent after
// its batch broke waits on nothing, because its first post followed the
// wait on its group's event, and the bytes stay in the prefill's pool until
// the chunk ends.
var Passed Event = passedEvent{}

type passedEvent struct{}

func (passedEvent) Wait(context.Context) error { return nil }

// TraceName names the event in traces.
func (passedEvent) TraceName() string { return "passed" }

// String names the event in test output.
func (passedEvent) String() string { return "passed" }

// Rest is the Work sequence number of the buffers that no fired group covered
// (hookless buffers, groups that never fired, or everything for a
// monolithic send).
const Rest = -1

// Status is how a chunk context ended.
type Status int

const (
	// Succeeded: every byte the chunk owes is visible at its destinations.
	Succeeded Status = iota
	// Failed: a wait, a post, a completion or the timeout failed; no write of
	// the chunk can land any more.
	Failed
	// Dropped: the chunk was dropped (abort); no write of it can land any more.
	Dropped
)

// String returns the status in capitals, as logs and reports print it.
func (s Status) String() string {
	switch s {
	case Succeeded:
		return "SUCCESS"
	case Failed:
		return "FAILED"
	case Dropped:
		return "DROPPED"
	}
	return "UNKNOWN"
}

// Result is a chunk context's outcome.
type Result struct {
	Chunk    Chunk
	PerLayer bool
	Status   Status
	Err      error // why it failed; nil on success
	Stats    Stats
}

// Stats are one chunk's transfer figures.
type Stats struct {
	Bytes   uint64 // bytes posted
	Blocks  int    // contiguous writes posted
	Batches int    // batches posted
	Groups  int    // groups accepted from the chunk's forward
	Ignored int    // GroupReady messages ignored (duplicates, other forwards)
	// Strays are Submitted and BatchDone messages ignored: they answered
	// no Work the chunk sent, or one already answered.
	Strays int
	// Resent counts the Works re-sent after their batch broke or its
	// completion was overdue (a group, or the rest, to one destination).
	Resent int `trace:"omitempty"`
	// Overdue counts the batches whose completion did not come within the
	// chunk's completion deadline (BatchOverdue): each was written off and
	// its Work re-sent, or, past the resend limit, torn down.
	Overdue int `trace:"omitempty"`
	// FirstPost and LastDone bracket the chunk's writes (zero if none).
	FirstPost, LastDone time.Time
	// ForwardEnd is when the chunk's forward ended (zero if it never did).
	ForwardEnd time.Time
	// EventWait is the total time submitters waited on the chunk's events.
	EventWait time.Duration
	// Exposed is Finish's return minus ForwardDone: the transfer time the
	// forward did not hide (set by Finish; zero without a forward end, and
	// zero when the forward had not ended on the device when Finish
	// returned).
	Exposed time.Duration

	// The fields below are measurements that decide nothing. They are left
	// out of recorded message traces (tag trace:"-"), so that traces
	// recorded before them replay unchanged (tests/testdata/traces).

	// Forward is the forward the chunk bound to (0 if none).
	Forward uint64 `trace:"-"`
	// ForwardDone is when the forward's end-of-forward event completed on
	// the device: its device timestamp where the stream provides one (set
	// by Finish), else when a submitter's wait on it returned. ForwardEnd
	// is only when the host queued it; the GPU may run a forward behind.
	ForwardDone time.Time `trace:"-"`
	// LastWait and LastPost are the last event wait that returned and the
	// last post, of the batches posted (zero if none): with ForwardDone,
	// LastDone and Finish's return they split the exposed time into
	// phases.
	LastWait, LastPost time.Time `trace:"-"`
}

// --- Forward actor ---

// Pending tells the forward actor that a chunk was registered: the next
// forward to begin binds it.
type Pending struct {
	Chunk Chunk
	PID   *actor.PID
}

// Begin starts a forward: every pending chunk binds to it and to no other.
type Begin struct {
	Forward uint64
	At      time.Time
	// Bound, if set, receives how many chunks bound to the forward, so that
	// a forward with none records no event at all.
	Bound chan<- int
}

// Boundary says that the forward enqueued the last layer of Group and
// recorded Event after it (or failed to: Err).
type Boundary struct {
	Forward uint64
	Group   int
	Event   Event
	Err     error
}

// End says that the forward enqueued its last kernel and recorded Event
// after it (or failed to: Err).
type End struct {
	Forward uint64
	Event   Event
	Err     error
	At      time.Time
}

// Forget removes a finished chunk from the forward actor's lists.
type Forget struct {
	Chunk Chunk
}

// --- Chunk actor ---

// Bind tells a chunk which forward writes it.
type Bind struct {
	Forward uint64
}

// GroupReady offers a chunk one group of its forward.
type GroupReady struct {
	Forward uint64
	Group   int
	Event   Event
	Err     error
}

// ForwardEnd tells a chunk that its forward ended; Event completes when
// everything the forward enqueued ran.
type ForwardEnd struct {
	Forward uint64
	Event   Event
	Err     error
	At      time.Time
}

// PeerLost tells every submitter that a decode peer is gone: each closes its
// endpoint to it, which fails the batches still in flight there at once
// (the transport's Close is a barrier), so their chunks fail closed now
// rather than at their finish timeout.
type PeerLost struct {
	Peer string
	// Record is the engine's record of the peer that was lost (a
	// *plan.Peer, which this package cannot name): a submitter that hears
	// of the loss late may already have connected to the peer added again
	// under its id (a decode server that restarted), whose endpoint is
	// not the lost one's. Nil: every endpoint to Peer.
	Record any `trace:"-"`
}

// Finish asks for the room's front chunk to complete within Timeout. Event
// was recorded on the compute stream when Finish was called: it gates what is
// still unsent if the chunk never saw a forward.
type Finish struct {
	Room    uint64
	Timeout time.Duration
	// Ctx is the caller's context: if it is cancelled the chunk fails (and
	// still quiesces before it answers). Abandoned is its error when it was
	// done already at the call: the chunk then fails at once and posts
	// nothing more, rather than racing its landings with the cancellation.
	Ctx       context.Context
	Abandoned error `trace:"omitempty"`
	Event     Event
	EventErr  error
	Reply     chan<- Result
}

// Drop aborts every queued chunk of a room; Reply receives their results
// after each of them quiesced. With Peer set the room is dropped only if
// one of its live chunks has a destination on that decode peer (a decode's
// cancel reaches only rooms it receives); otherwise Drop answers as for a
// room with no chunk.
type Drop struct {
	Room    uint64
	Timeout time.Duration
	Peer    string `trace:"omitempty"`
	Reply   chan<- []Result
}

// Cancel fails a chunk now (its Finish caller gave up).
type Cancel struct {
	Reason error
}

// Timeout fires when a chunk's finish or drop deadline passed.
type Timeout struct{}

// TornDown reports the teardown a chunk asked for at its deadline; Err
// (marked rdma.ErrNotQuiesced) when writes may still land.
type TornDown struct {
	Err error
}

// Quiesced reports the quiescence a chunk asked for before it re-sends the
// Work (Seq, Dest) whose batch broke: Err is nil when the transport
// confirmed that nothing of the broken endpoint can land any more and the
// peer is not lost; otherwise it says why the chunk cannot resume.
type Quiesced struct {
	Seq, Dest int
	Err       error
}

// BatchOverdue tells a chunk that the batch of its Work (Seq, Dest) posted
// as Try has had no completion within the chunk's completion deadline
// (the shell's timer of a WatchBatch effect): the chunk treats it as lost,
// unless the transport has more in flight than a slow but healthy link
// drains within the deadline.
type BatchOverdue struct {
	Seq, Dest, Try int
	// InFlight is the bytes of every chunk's batches posted and not
	// completed when the timer fired (the engine's, this batch's included).
	InFlight uint64
}

// Work asks a submitter to wait Event, then post the blocks of Buffers over
// the chunk's runs to destination Dest, as one batch. It is what a chunk's
// core decides; the chunk's shell sends it with the chunk's data-plane job
// and its own address attached (actors.Work).
type Work struct {
	Chunk   Chunk
	Seq     int // group, or Rest
	Dest    int // index of the destination in the chunk's plan
	Buffers []int
	Event   Event
	// Try counts the Work's earlier posts (0: the first): a re-send after a
	// broken or overdue batch carries the next one, and its BatchDone
	// echoes it.
	Try int `trace:"omitempty"`
}

// Submitted reports one Work back to its chunk: posted (a batch is in
// flight), skipped (the chunk was cancelled) or failed.
type Submitted struct {
	Seq    int
	Dest   int
	Posted bool
	Err    error
	Bytes  uint64
	Blocks int
	// The event wait took [WaitStart, WaitEnd); the batch was posted at
	// PostedAt.
	WaitStart, WaitEnd, PostedAt time.Time
}

// BatchDone reports a posted batch's completion.
type BatchDone struct {
	Seq  int
	Dest int
	Err  error
	At   time.Time
	// Broken says that Err is the batch's endpoint breaking (marked
	// rdma.ErrEndpointBroken, neither rdma.ErrNotQuiesced nor a lost
	// peer): a fresh endpoint may succeed. Set by the submitter, where the
	// error's classes are known; a recorded trace keeps it, and only the
	// error's text.
	Broken bool `trace:"omitempty"`
	// Try is the Work's Try: which post of the Work this batch was, so
	// that the completion of a batch the chunk wrote off (BatchOverdue)
	// and re-sent, arriving late, is told apart from the re-send's.
	Try int `trace:"omitempty"`
}

// ChunkDone tells a room that one of its chunks ended.
type ChunkDone struct {
	Result Result
}

// --- Room and manager ---

// AddChunk registers a chunk in its room. Start starts the chunk's context
// under its room (the room's PID) and returns its address, if the room has
// no active context with that key.
type AddChunk struct {
	Chunk    Chunk
	PerLayer bool
	// Owned and Dests summarize the plan (pages this rank sends per buffer
	// and destination, and real destinations): with PerLayer they are all a
	// chunk's core needs, which lets a trace rebuild it.
	Owned, Dests int
	// Peers are the decode peers of its real destinations, which a Drop
	// scoped to a peer checks.
	Peers []string `trace:"omitempty"`
	Start func(room *actor.PID) *actor.PID
	Reply chan<- Added
}

// Added answers AddChunk.
type Added struct {
	Chunk    Chunk // the active context: the new one, or the existing one
	PerLayer bool
	Existing bool // the key was already active: nothing changed
}

// RoomIdle tells the manager that a room holds no chunk. Seen counts the
// manager's messages the room has handled, so that the manager stops it only
// if nothing is in flight to it.
type RoomIdle struct {
	Room uint64
	Seen uint64
}
