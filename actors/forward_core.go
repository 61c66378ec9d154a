package actors

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/messages"
)

// Target is a chunk and the address of its actor (plain data to the core).
type Target struct {
	Chunk messages.Chunk
	PID   *actor.PID
}

// ForwardCore binds registered chunks to forwards and fans a forward's group
// boundaries out to its chunks only. A chunk registered before Begin binds to
// that forward and no other (invariant 4), so a later forward re-firing the
// same layers never reaches it.
type ForwardCore struct {
	pending  []Target
	forwards map[uint64][]Target
	out      []Effect
}

// NewForwardCore returns an empty core.
func NewForwardCore() *ForwardCore {
	return &ForwardCore{forwards: map[uint64][]Target{}}
}

// Active returns the chunks bound to forward f (for tests and traces).
func (c *ForwardCore) Active(f uint64) []messages.Chunk { return chunksOf(c.forwards[f]) }

// Pending returns the chunks waiting for a forward (for tests and traces).
func (c *ForwardCore) Pending() []messages.Chunk { return chunksOf(c.pending) }

func chunksOf(ts []Target) []messages.Chunk {
	out := make([]messages.Chunk, len(ts))
	for i, t := range ts {
		out[i] = t.Chunk
	}
	return out
}

// Step feeds one message; the returned slice is reused by the next call.
func (c *ForwardCore) Step(msg any) []Effect {
	// Cleared, not only truncated: the last fan-out's targets hold their
	// chunk actors (a PID caches its process), which would stay alive
	// until the next fan-out overwrote them.
	clear(c.out)
	c.out = c.out[:0]
	switch m := msg.(type) {
	case *messages.Pending:
		c.pending = append(c.pending, Target{Chunk: m.Chunk, PID: m.PID})
	case *messages.Begin:
		bound := c.pending
		c.pending = nil
		if len(bound) > 0 {
			c.forwards[m.Forward] = bound
			c.out = append(c.out, FanOut{To: bound, Msg: &messages.Bind{Forward: m.Forward}})
		}
		if m.Bound != nil {
			c.out = append(c.out, AnswerBegin{To: m.Bound, N: len(bound)})
		}
	case *messages.Boundary:
		if to := c.forwards[m.Forward]; len(to) > 0 {
			// One message value for every chunk: chunk cores only read it.
			c.out = append(c.out, FanOut{To: to, Msg: &messages.GroupReady{Forward: m.Forward, Group: m.Group, Event: m.Event, Err: m.Err}})
		}
	case *messages.End:
		if to := c.forwards[m.Forward]; len(to) > 0 {
			c.out = append(c.out, FanOut{To: to, Msg: &messages.ForwardEnd{Forward: m.Forward, Event: m.Event, Err: m.Err, At: m.At}})
		}
		delete(c.forwards, m.Forward)
	case *messages.Forget:
		c.pending = without(c.pending, m.Chunk)
		for f, ts := range c.forwards {
			c.forwards[f] = without(ts, m.Chunk)
		}
	}
	return c.out
}

// without returns ts minus x, copying: a FanOut may still hold the old list.
func without(ts []Target, x messages.Chunk) []Target {
	for i, t := range ts {
		if t.Chunk == x {
			return append(ts[:i:i], ts[i+1:]...)
		}
	}
	return ts
}
