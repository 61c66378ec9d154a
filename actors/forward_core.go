package actors

import (
	"github.com/kvstream/kvstream/messages"
)

// Send asks a shell to deliver Msg to chunk To.
type Send struct {
	To  messages.Chunk
	Msg any
}

// Answer tells BeginForward how many chunks bound to its forward.
type Answer struct {
	To chan<- int
	N  int
}

func (Send) effect()   {}
func (Answer) effect() {}

// ForwardCore binds registered chunks to forwards and fans a forward's group
// boundaries out to its chunks only. A chunk registered before Begin binds to
// that forward and no other (invariant 4), so a later forward re-firing the
// same layers never reaches it.
type ForwardCore struct {
	pending  []messages.Chunk
	forwards map[uint64][]messages.Chunk
	out      []Effect
}

// NewForwardCore returns an empty core.
func NewForwardCore() *ForwardCore {
	return &ForwardCore{forwards: map[uint64][]messages.Chunk{}}
}

// Active returns the chunks bound to forward f (shared; for tests).
func (c *ForwardCore) Active(f uint64) []messages.Chunk { return c.forwards[f] }

// Pending returns the chunks waiting for a forward (shared; for tests).
func (c *ForwardCore) Pending() []messages.Chunk { return c.pending }

// Step feeds one message; the returned slice is reused by the next call.
func (c *ForwardCore) Step(msg any) []Effect {
	c.out = c.out[:0]
	switch m := msg.(type) {
	case *messages.Pending:
		c.pending = append(c.pending, m.Chunk)
	case *messages.Begin:
		bound := c.pending
		c.pending = nil
		if len(bound) > 0 {
			c.forwards[m.Forward] = bound
		}
		bind := &messages.Bind{Forward: m.Forward}
		for _, ch := range bound {
			c.out = append(c.out, Send{To: ch, Msg: bind})
		}
		if m.Bound != nil {
			c.out = append(c.out, Answer{To: m.Bound, N: len(bound)})
		}
	case *messages.Boundary:
		// One message value for every chunk: chunk cores only read it, so
		// the fan-out allocates nothing per context.
		gr := &messages.GroupReady{Forward: m.Forward, Group: m.Group, Event: m.Event, Err: m.Err}
		for _, ch := range c.forwards[m.Forward] {
			c.out = append(c.out, Send{To: ch, Msg: gr})
		}
	case *messages.End:
		fe := &messages.ForwardEnd{Forward: m.Forward, Event: m.Event, Err: m.Err, At: m.At}
		for _, ch := range c.forwards[m.Forward] {
			c.out = append(c.out, Send{To: ch, Msg: fe})
		}
		delete(c.forwards, m.Forward)
	case *messages.Forget:
		c.pending = without(c.pending, m.Chunk)
		for f, chunks := range c.forwards {
			c.forwards[f] = without(chunks, m.Chunk)
		}
	}
	return c.out
}

func without(chunks []messages.Chunk, x messages.Chunk) []messages.Chunk {
	for i, ch := range chunks {
		if ch == x {
			return append(chunks[:i:i], chunks[i+1:]...)
		}
	}
	return chunks
}
