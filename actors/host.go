package actors

import (
	"runtime"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
)

// A chunk context is not a protoactor actor of its own: it is a hostedChunk,
// registered in the actor system as a Process so that everything that
// addresses it (the forward actor, its room, the submitters, the transport's
// completions, its own timers) still sends to its PID, but whose messages go
// to the queue of one of a few chunk hosts. A host steps its chunks' cores
// on the engine's Dispatcher, as many messages as are queued per activation.
//
// A chunk actor of its own cost a mailbox activation per message (a
// scheduling on the Dispatcher, a worker's wake-up) and an actor spawn and
// stop per chunk; at a group boundary the forward thread (or a relay) sent
// one message per chunk. With hosts, a boundary is one queue entry per host
// carrying every chunk bound to the forward there, and the completions of
// many chunks that arrive together are handled in one activation: the cost
// per chunk context is its core's step.
//
// Hosted chunks keep an actor's guarantees: each chunk's messages are
// handled one at a time, in the order each sender sent them (a chunk always
// lives on the same host, whose queue is FIFO); a stopped chunk takes no
// message any more (protoactor's dead letters); its room sees it terminate.
// A host never blocks: a chunk's effects only compute, send, and answer on
// buffered channels; what may block (tearing down endpoints, quiescing a
// broken one) runs on a goroutine of its own and reports back by message.

// hostBudget is how many messages a host handles before it yields its
// worker to the other hosts, the rooms and the manager (protoactor's
// mailbox throughput, which the Dispatcher gives too).
const hostBudget = 300

// chunkHost is one queue of chunk messages and the activation that drains it.
type chunkHost struct {
	env *Env

	mu        sync.Mutex
	queue     []hostItem
	scheduled bool // an activation is scheduled or running: push schedules none

	spare []hostItem // the drained queue, reused (only the activation touches it)
}

// hostItem is one message for one chunk, or a fan-out: one message for
// every chunk of to, in order.
type hostItem struct {
	c      *hostedChunk
	to     []*hostedChunk
	msg    any
	sender *actor.PID
}

// hostStop asks a host to stop a chunk's timers: Stop may come from any
// goroutine, the timers belong to the host's.
type hostStop struct{}

func (h *chunkHost) push(it hostItem) {
	h.mu.Lock()
	h.queue = append(h.queue, it)
	schedule := !h.scheduled
	h.scheduled = true
	h.mu.Unlock()
	if schedule {
		h.env.Dispatcher.Schedule(h.run)
	}
}

// run handles what is queued, up to hostBudget messages, then yields.
func (h *chunkHost) run() {
	handled := 0
	for handled < hostBudget {
		h.mu.Lock()
		q := h.queue
		if len(q) == 0 {
			h.scheduled = false
			h.mu.Unlock()
			return
		}
		h.queue = h.spare[:0]
		h.mu.Unlock()
		for i := range q {
			it := &q[i]
			if it.c != nil {
				it.c.handle(it.msg, it.sender)
				handled++
			} else {
				for _, c := range it.to {
					c.handle(it.msg, nil)
				}
				handled += len(it.to)
			}
			q[i] = hostItem{} // the chunks and the message may go
		}
		h.spare = q[:0]
	}
	h.env.Dispatcher.Schedule(h.run) // still scheduled: pushes schedule nothing
}

// hosts returns the engine's chunk hosts, starting them on first use: one
// per processor, so that as many chunks are stepped at once as the
// Dispatcher has workers.
func (e *Env) hosts() []*chunkHost {
	e.hostsOnce.Do(func() {
		n := max(2, runtime.GOMAXPROCS(0))
		for range n {
			e.chunkHosts = append(e.chunkHosts, &chunkHost{env: e})
		}
	})
	return e.chunkHosts
}

// hostOf returns the host of chunk c: its serial picks it, so that the
// chunks of a forward spread evenly.
func (e *Env) hostOf(c messages.Chunk) *chunkHost {
	hs := e.hosts()
	return hs[c.Serial%uint64(len(hs))]
}

// hostedOf returns the hosted chunk behind pid, or nil if pid is not one.
func (e *Env) hostedOf(pid *actor.PID) *hostedChunk {
	if pid == nil {
		return nil
	}
	p, ok := e.System.ProcessRegistry.GetLocal(pid.Id)
	if !ok {
		return nil
	}
	c, _ := p.(*hostedChunk)
	return c
}

// recoverChunk keeps a host alive when a chunk's step panics (a bug): the
// chunk loses that message, logged, and its timer still bounds its Finish.
func (c *hostedChunk) recoverChunk(msg any) {
	if r := recover(); r != nil {
		c.env.Log.Error("chunk panicked handling a message; the message is lost",
			zap.Uint64("room", c.job.ID().Room), zap.Int("chunk", c.job.ID().Start), zap.String("message", trace.TypeName(msg)), zap.Any("panic", r))
	}
}
