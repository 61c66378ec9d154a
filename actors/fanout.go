package actors

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/messages"
)

// RelayThreshold is the most chunks a forward's boundaries are fanned out
// to from the forward thread itself. A forward bound to more has its group
// boundaries and its end handed to Relays relay actors, one message each,
// and the relays post to the chunks: the forward thread's cost per boundary
// then stays a hash per chunk and Relays sends, where one message per chunk
// costs 60-80 ns (protoactor's mailbox: a queue node and a scheduling).
// Below it the direct sends are cheaper than the hand-off to a relay.
const RelayThreshold = 64

// Relays is how many relay actors a forward shell fans out through.
const Relays = 4

// relayBatch asks a relay to post msg to every chunk of to, in order.
type relayBatch struct {
	to  []*actor.PID
	msg any
}

// relayActor posts a batch's message to its chunks. A chunk always goes
// through the same relay (its serial picks it), and one relay handles its
// mailbox in order, so a chunk sees its forward's boundaries and end in the
// order the forward thread sent them.
type relayActor struct{}

func (relayActor) Receive(ctx actor.Context) {
	if b, ok := ctx.Message().(*relayBatch); ok {
		for _, pid := range b.to {
			ctx.Send(pid, b.msg)
		}
	}
}

// fanOut delivers the forward core's FanOut effects. Whether a forward's
// messages are relayed is decided once, at its Bind (which always goes
// directly, so that a chunk is bound before BeginForward returns), and kept
// to its end: mixing direct and relayed sends for one forward could reorder
// a chunk's messages.
type fanOut struct {
	env     *Env
	relays  []*actor.PID
	relayed map[uint64]bool
}

func (f *fanOut) deliver(ctx actor.Context, e FanOut) {
	switch m := e.Msg.(type) {
	case *messages.Bind:
		if len(e.To) > RelayThreshold {
			f.relayed[m.Forward] = true
		}
	case *messages.GroupReady:
		if f.relayed[m.Forward] {
			f.relay(ctx, e)
			return
		}
	case *messages.ForwardEnd:
		if f.relayed[m.Forward] {
			delete(f.relayed, m.Forward)
			f.relay(ctx, e)
			return
		}
	}
	for _, t := range e.To {
		ctx.Send(t.PID, e.Msg)
	}
}

// relay splits the targets by relay (one allocation holds every share) and
// sends each relay its share.
func (f *fanOut) relay(ctx actor.Context, e FanOut) {
	if f.relays == nil {
		for range Relays {
			f.relays = append(f.relays, ctx.Spawn(actor.PropsFromProducer(func() actor.Actor { return relayActor{} },
				f.env.props(actor.WithDispatcher(f.env.Dispatcher))...)))
		}
	}
	var count [Relays]int
	for _, t := range e.To {
		count[t.Chunk.Serial%Relays]++
	}
	var at [Relays]int
	for s := 1; s < Relays; s++ {
		at[s] = at[s-1] + count[s-1]
	}
	all := make([]*actor.PID, len(e.To))
	for _, t := range e.To {
		s := t.Chunk.Serial % Relays
		all[at[s]] = t.PID
		at[s]++
	}
	start := 0
	for s := range Relays {
		if count[s] > 0 {
			ctx.Send(f.relays[s], &relayBatch{to: all[start : start+count[s] : start+count[s]], msg: e.Msg})
		}
		start += count[s]
	}
}
