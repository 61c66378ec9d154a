package actors

import (
	"context"
	"time"

	"github.com/kvstream/kvstream/messages"
)

// Effect is something a core asks its shell to do. Every effect is listed in
// this file, under the core that emits it; the shells perform them (forward,
// manager and room in shells.go, chunk in chunk.go, submitter in
// submitter.go) and trace/replay routes them the way the shells do.
//
// Effect names say who answers what: an Answer* effect completes the façade
// call that waits on its channel (AnswerBegin, AnswerRegister, AnswerFinish,
// AnswerDrop), AnswerWork answers a chunk's Work; every other effect delivers
// a message to an actor, spawns or stops one, or acts on the hardware.
type Effect interface{ effect() }

// --- Forward core (ForwardCore) ---

// FanOut asks the forward shell to deliver one message to every target. The
// slice is the core's own list, shared read-only, so that a boundary with n
// active contexts allocates nothing per context.
type FanOut struct {
	To  []Target
	Msg any
}

// AnswerBegin answers BeginForward: how many chunks bound to its forward (a
// forward with none records no event at all).
type AnswerBegin struct {
	To chan<- int
	N  int
}

// --- Manager core (ManagerCore) ---

// SpawnRoom asks the manager shell to start a room actor.
type SpawnRoom struct{ Room uint64 }

// Route asks the manager shell to deliver Msg to a room actor.
type Route struct {
	Room uint64
	Msg  any
}

// StopRoom asks the manager shell to stop an idle room actor.
type StopRoom struct{ Room uint64 }

// The manager also emits AnswerFinish and AnswerDrop, for a room it does
// not know.

// --- Room core (RoomCore) ---

// SpawnChunk asks the room shell to start the chunk's context (its
// AddChunk's Start, under the room) and tell the forward actor it is
// pending.
type SpawnChunk struct {
	Add *messages.AddChunk
}

// AnswerRegister answers Register (the AddChunk of a registration): the
// active context, new or existing.
type AnswerRegister struct {
	To    chan<- messages.Added
	Added messages.Added
}

// Unqueue tells the shell that a chunk left the room's queue (popped by
// finish, or ended): a registration of its key creates a new context again.
type Unqueue struct{ Chunk messages.Chunk }

// Send asks the room shell to deliver Msg to chunk To.
type Send struct {
	To  messages.Chunk
	Msg any
}

// StopChunk lets go of an ended chunk's context: the room no longer
// addresses it. The context stopped itself when it ended (ChunkEnded), and
// made the forward actor forget it where that was needed.
type StopChunk struct{ Chunk messages.Chunk }

// AnswerDrop answers Drop once every dropped chunk quiesced (the room), or at
// once for a room that does not exist (the manager).
type AnswerDrop struct {
	To      chan<- []messages.Result
	Results []messages.Result
}

// Idle tells the manager the room holds no chunk.
type Idle struct{ Seen uint64 }

// The room also emits AnswerFinish, for a room with nothing queued.

// --- Chunk core (ChunkCore) ---

// Submit sends Work to the submitter pool (the shell attaches the job and
// the reply address: see Work).
type Submit struct{ Work messages.Work }

// StartTimer arms the chunk's deadline: after After, deliver Timeout. If
// Caller is set (the Finish caller's context), its end delivers Cancel
// sooner. The shell stops both when the chunk ends. The core never calls
// Caller: it only hands it to the shell (traces leave it out).
type StartTimer struct {
	After  time.Duration
	Caller context.Context
}

// CancelWork closes the chunk's gate: work not yet posted is skipped and
// event waits return. Batches already posted continue.
type CancelWork struct{}

// Teardown closes the gate and tears down every endpoint that still has a
// batch of this chunk in flight, so that nothing of it can land any more
// (invariant 10). The shell delivers TornDown when it is done.
type Teardown struct{}

// Resend asks the chunk shell to quiesce the endpoint on which the Work
// (Seq, Dest)'s batch broke, or its overdue batch went (the endpoint the
// Work was last posted on; Close it: when Close returns without
// rdma.ErrNotQuiesced nothing of it can land any more), to wait After, to
// check that the destination's peer is not lost, then to deliver
// Quiesced; the core re-sends the Work on a fresh endpoint when it comes
// back clean, or fenced (rdma.ErrFenced: quiet once the re-send landed).
type Resend struct {
	Seq, Dest int
	After     time.Duration
	Cause     error // how the batch broke, or that it was overdue, for the log
}

// WatchBatch asks the chunk shell to deliver BatchOverdue{Seq, Dest, Try}
// after After, with the engine's bytes in flight at that instant (Env
// InFlight): the deadline of the batch of the Work (Seq, Dest) posted as
// Try. The core ignores a watch whose batch completed, or was re-sent, in
// time, so the shell need not stop it before the chunk ends (it stops
// every timer then, as for StartTimer).
type WatchBatch struct {
	Seq, Dest, Try int
	After          time.Duration
}

// ChunkEnded tells the room that the chunk is over; its context stops. The
// forward actor is told to forget the chunk only if Forget: a chunk that saw
// its forward's end is listed there no more (the forward's End dropped its
// list in the step that sent ForwardEnd), and a message per room to say so
// would be one more hop at the end of every request.
type ChunkEnded struct {
	Result messages.Result
	Forget bool
}

// Stray says the chunk ignored a Submitted or BatchDone that answered no
// Work it sent, or one already answered: a transport or submitter that
// reported twice, which the shell logs at WARN. It counts as no progress.
type Stray struct {
	Seq, Dest int
	What      string // "Submitted" or "BatchDone"
}

// AnswerFinish answers Finish: the chunk's result, or (from the manager or
// the room) why there is no chunk to finish.
type AnswerFinish struct {
	To     chan<- messages.Result
	Result messages.Result
}

// --- Submitter (SubmitCore, one per Work) ---

// PostBatch asks the submitter shell to connect to the destination (on first
// use), build the Work's writes and post them as one batch through the
// chunk's gate, then report PostEnded. Try counts from 1.
type PostBatch struct{ Try int }

// Disconnect asks the submitter shell to close and forget its endpoint to
// Peer: the peer is lost, or the endpoint broke.
type Disconnect struct{ Peer string }

// AnswerWork answers the chunk's Work (the shell sends it Submitted):
// Posted (a batch is in flight), Skipped (the chunk closed its gate: nothing
// posted, no error) or Failed (Err says why).
type AnswerWork struct {
	Outcome Outcome
	Err     error
}

// Restart asks the submitter shell to panic after answering, so that its
// supervisor restarts it with fresh endpoints; Cause is what broke.
type Restart struct {
	Peer  string
	Cause error
}

// Escalate asks the submitter shell to panic after answering with a lost
// device: nothing a restart fixes, the engine turns unhealthy for good.
type Escalate struct{ Cause error }

func (FanOut) effect()         {}
func (AnswerBegin) effect()    {}
func (SpawnRoom) effect()      {}
func (Route) effect()          {}
func (StopRoom) effect()       {}
func (SpawnChunk) effect()     {}
func (AnswerRegister) effect() {}
func (Unqueue) effect()        {}
func (Send) effect()           {}
func (StopChunk) effect()      {}
func (AnswerDrop) effect()     {}
func (Idle) effect()           {}
func (Submit) effect()         {}
func (Stray) effect()          {}
func (StartTimer) effect()     {}
func (CancelWork) effect()     {}
func (Teardown) effect()       {}
func (Resend) effect()         {}
func (WatchBatch) effect()     {}
func (ChunkEnded) effect()     {}
func (AnswerFinish) effect()   {}
func (PostBatch) effect()      {}
func (Disconnect) effect()     {}
func (AnswerWork) effect()     {}
func (Restart) effect()        {}
func (Escalate) effect()       {}
