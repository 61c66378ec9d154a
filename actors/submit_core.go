package actors

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/rdma"
)

// Outcome is what a submitter answers a chunk's Work with.
type Outcome int

const (
	// WorkPosted: a batch is in flight; the chunk waits for its BatchDone.
	WorkPosted Outcome = iota
	// WorkSkipped: the chunk closed its gate (it failed, timed out or was
	// dropped) before the batch was posted; nothing is in flight and nothing
	// failed.
	WorkSkipped
	// WorkFailed: the wait, the connection or the post failed; the chunk
	// fails.
	WorkFailed
)

// String names the outcome as tests print it.
func (o Outcome) String() string {
	switch o {
	case WorkPosted:
		return "posted"
	case WorkSkipped:
		return "skipped"
	case WorkFailed:
		return "failed"
	}
	return "unknown"
}

// SubmitTries is how many times a submitter posts one Work: an endpoint may
// have been torn down by another chunk's quiescence since its last batch, and
// nothing was posted on a failed Post, so one retry on a fresh endpoint is
// safe; a second failure is real.
const SubmitTries = 2

// WaitEnded tells a SubmitCore how its Work's event wait ended.
type WaitEnded struct {
	Err error // nil: the event completed
	// Cancelled: the chunk's context is done (it closed its gate), which is
	// why a wait that failed returned.
	Cancelled bool
	// PeerLost is why the destination peer was reported lost, if it was.
	PeerLost error
}

// PostEnded tells a SubmitCore how the PostBatch it asked for ended.
type PostEnded struct {
	ConnErr error // connecting or importing the peer's buffers failed: nothing was posted
	Posted  bool  // a batch is in flight
	Err     error // Post refused the batch: nothing was posted
	Writes  int   // the writes of the batch (for the error)
}

// SubmitCore decides what one Work comes to; the submitter shell only
// waits, connects, posts and panics. A failed wait fails the Work, unless
// the chunk was cancelled (then it is skipped), and a lost device also
// escalates; a lost peer fails it without a restart (nothing to restart
// for); a broken endpoint is retried once on a fresh connection, and a
// second failure, or a failed connection, fails the Work and restarts the
// submitter with fresh endpoints. Any other post error only fails the Work.
//
// One core per Work: no goroutines, no clocks, no hardware. A PostBatch is
// always the last effect of a step: what follows depends on how it ends.
type SubmitCore struct {
	peer  string
	tries int
	done  bool
	out   []Effect
}

// NewSubmitCore returns the core of a Work whose destination is peer.
func NewSubmitCore(peer string) *SubmitCore { return &SubmitCore{peer: peer} }

// reset makes c the core of a new Work whose destination is peer, keeping
// the array of its effects (its elements cleared): a submitter reuses its
// cores from one serve to the next, so that deciding a Work allocates
// nothing.
func (c *SubmitCore) reset(peer string) {
	clear(c.out[:cap(c.out)]) // the last Work's errors may go
	*c = SubmitCore{peer: peer, out: c.out[:0]}
}

// Step feeds one report (*WaitEnded, then *PostEnded after each PostBatch)
// and returns the effects to perform, in order. The returned slice is reused
// by the next call.
func (c *SubmitCore) Step(msg any) []Effect {
	c.out = c.out[:0]
	if c.done {
		return c.out
	}
	switch m := msg.(type) {
	case *WaitEnded:
		c.waited(m)
	case *PostEnded:
		c.postEnded(m)
	}
	return c.out
}

func (c *SubmitCore) waited(m *WaitEnded) {
	switch {
	case m.Err != nil && m.Cancelled:
		c.answer(WorkSkipped, nil)
	case m.Err != nil:
		c.answer(WorkFailed, errors.Mark(m.Err, ErrEventWait))
		if errors.Is(m.Err, cuda.ErrDeviceLost) {
			c.out = append(c.out, Escalate{Cause: m.Err})
		}
	case m.PeerLost != nil:
		c.out = append(c.out, Disconnect{Peer: c.peer})
		c.answer(WorkFailed, m.PeerLost)
	default:
		c.post()
	}
}

func (c *SubmitCore) post() {
	c.tries++
	c.out = append(c.out, PostBatch{Try: c.tries})
}

func (c *SubmitCore) postEnded(m *PostEnded) {
	switch {
	case m.ConnErr != nil:
		c.answer(WorkFailed, m.ConnErr)
		c.out = append(c.out, Restart{Peer: c.peer, Cause: m.ConnErr})
	case m.Err == nil && m.Posted:
		c.answer(WorkPosted, nil)
	case m.Err == nil:
		c.answer(WorkSkipped, nil) // the gate was closed
	case !errors.Is(m.Err, rdma.ErrEndpointBroken):
		c.answer(WorkFailed, errors.Wrapf(m.Err, "post %d writes to %s", m.Writes, c.peer))
	case c.tries < SubmitTries:
		c.out = append(c.out, Disconnect{Peer: c.peer})
		c.post()
	default:
		c.out = append(c.out, Disconnect{Peer: c.peer})
		c.answer(WorkFailed, errors.Wrapf(m.Err, "post %d writes to %s", m.Writes, c.peer))
		c.out = append(c.out, Restart{Peer: c.peer, Cause: m.Err})
	}
}

// answer answers the Work. Restart and Escalate come after it: a message
// that panics is lost on restart, and the chunk must hear about its work.
func (c *SubmitCore) answer(o Outcome, err error) {
	c.done = true
	c.out = append(c.out, AnswerWork{Outcome: o, Err: err})
}
