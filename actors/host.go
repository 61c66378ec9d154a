package actors

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
)

// A chunk context is not a protoactor actor of its own, nor is a room: each
// is a process (hostedChunk, hostedRoom) registered in the actor system so
// that everything that addresses it (the forward actor, the manager, its
// room, the submitters, the transport's completions, its own timers) still
// sends to its PID, but whose messages go to the queue of one of a few
// hosts. A host steps its processes' cores on the engine's Dispatcher, as
// many messages as are queued per activation.
//
// An actor of its own cost a mailbox activation per message (a scheduling
// on the Dispatcher, a worker's wake-up) and an actor spawn and stop per
// chunk and per room; at a group boundary the forward thread (or a relay)
// sent one message per chunk. With hosts, a boundary is one queue entry per host
// carrying every chunk bound to the forward there, and the completions of
// many chunks that arrive together are handled in one activation: the cost
// per chunk context is its core's step.
//
// Hosted processes keep an actor's guarantees: each one's messages are
// handled one at a time, in the order each sender sent them (it always
// lives on the same host, whose queue is FIFO); a stopped one takes no
// message any more (protoactor's dead letters); its parent sees it
// terminate, a room only once its chunks did. A chunk that ends stops itself
// (end), and then its room hears it terminate only if the room is stopping:
// it knows of the end by message, and waits for its children only then.
// A host never blocks on a chunk: a chunk's effects only compute, send, and
// answer on buffered channels (the removal of a peer whose last chunk ended
// may wait for the engine's registration lock, whose holders never wait on
// a chunk); what may block (tearing down endpoints, quiescing a broken one)
// runs on a goroutine of its own and reports back by message.

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

// hostItem is one message for one hosted process, or a fan-out: one
// message for every chunk of to, in order.
type hostItem struct {
	p      *process
	to     []*hostedChunk
	msg    any
	sender *actor.PID
}

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
			if it.p != nil {
				it.p.deliver(it.msg, it.sender)
				handled++
			} else {
				for _, c := range it.to {
					c.deliver(it.msg, nil)
				}
				handled += len(it.to)
			}
			q[i] = hostItem{} // the chunks and the message may go
		}
		h.spare = q[:0]
	}
	h.env.Dispatcher.Schedule(h.run) // still scheduled: pushes schedule nothing
}

// hosted is what a host runs: a chunk context or a room.
type hosted interface {
	// handle handles one message (the process is not stopped).
	handle(msg any, sender *actor.PID)
	// stopping releases what the process holds once it stopped (timers,
	// a job's gate) and stops its children: it returns them, and the
	// process terminates once each of them did, as an actor does.
	stopping() (children []*actor.PID)
}

// process is a hosted chunk or room as the actor system sees it: a
// Process registered under a PID, whose user messages join its host's
// queue, and which stops as an actor does: once Stop is called it takes no
// message, then (on its host, in order with its messages) it releases what
// it holds, leaves the registry, and its parent and watchers hear that it
// terminated (a hosted parent of a process that ended itself only while it
// stops: end).
type process struct {
	env          *Env
	host         *chunkHost
	root         *actor.RootContext
	self, parent *actor.PID
	owner        hosted
	stopped      atomic.Bool
	// hostedParent is its parent's process when that is hosted too (a
	// chunk's room), nil otherwise.
	hostedParent *process

	mu       sync.Mutex
	watchers []*actor.PID // told when it terminates (a StopFuture's watch)
	gone     bool         // it terminated: a watcher is told at once

	// awaiting are the children it stopped and waits to hear terminate
	// before it terminates itself (only its host touches it).
	awaiting map[string]bool
}

var _ actor.Process = (*process)(nil)

// hostStop is the host's part of a Stop: Stop may come from any goroutine,
// what the process holds belongs to its host's activation.
type hostStop struct{}

// register makes p, run by owner on host, the process of id under parent.
func (p *process) register(env *Env, host *chunkHost, owner hosted, id string, parent *actor.PID) (*actor.PID, error) {
	p.env, p.host, p.root, p.owner, p.parent = env, host, env.System.Root, owner, parent
	if parent != nil {
		if pp, ok := env.System.ProcessRegistry.GetLocal(parent.Id); ok {
			p.hostedParent, _ = pp.(*process)
		}
	}
	pid, added := env.System.ProcessRegistry.Add(p, id)
	if !added {
		return pid, actor.ErrNameExists
	}
	p.self = pid
	return pid, nil
}

// hostedProps are props whose spawn registers a hosted process with start,
// under the actor that spawns it.
func hostedProps(start func(id string, parent *actor.PID) (*actor.PID, error)) *actor.Props {
	return actor.PropsFromFunc(func(actor.Context) {}, actor.WithSpawnFunc(
		func(_ *actor.ActorSystem, id string, _ *actor.Props, parent actor.SpawnerContext) (*actor.PID, error) {
			return start(id, parent.Self())
		}))
}

// childID names a child of parent as protoactor names a spawned one.
func childID(env *Env, parent *actor.PID) string {
	if parent == nil {
		return env.System.ProcessRegistry.NextId()
	}
	return parent.Id + "/" + env.System.ProcessRegistry.NextId()
}

// SendUserMessage implements actor.Process: the message joins the host's
// queue.
func (p *process) SendUserMessage(_ *actor.PID, message any) {
	_, msg, sender := actor.UnwrapEnvelope(message)
	p.host.push(hostItem{p: p, msg: msg, sender: sender})
}

// SendSystemMessage implements actor.Process: a stop (its parent
// stopping) stops it; a watcher is told when it terminates, at once if it
// did already. Nothing else applies.
func (p *process) SendSystemMessage(_ *actor.PID, message any) {
	switch m := message.(type) {
	case *actor.Stop:
		p.Stop(p.self)
	case *actor.Watch:
		p.mu.Lock()
		gone := p.gone
		if !gone {
			p.watchers = append(p.watchers, m.Watcher)
		}
		p.mu.Unlock()
		if gone {
			p.terminated(m.Watcher)
		}
	case *actor.Unwatch:
		p.mu.Lock()
		p.watchers = slices.DeleteFunc(p.watchers, func(w *actor.PID) bool { return w.Equal(m.Watcher) })
		p.mu.Unlock()
	case *actor.Terminated:
		p.host.push(hostItem{p: p, msg: childGone{who: m.Who}})
	}
}

// childGone is a child's Terminated, on its parent's host.
type childGone struct{ who *actor.PID }

// Stop implements actor.Process: it takes no message from now on; its host
// finishes the stop.
func (p *process) Stop(*actor.PID) {
	if !p.stopped.Swap(true) {
		p.host.push(hostItem{p: p, msg: hostStop{}})
	}
}

// end stops and terminates p from its own step, once it is over (a chunk
// that answered): what it held is released already, and it has no
// children. A Stop that came first finishes the stop instead (its hostStop
// is queued on this host).
//
// A hosted parent hears of it only if it is stopping, the one time it
// waits for its children (it knows of the end already, by message): one
// hop fewer on its host per request. A parent whose stop looked up this
// process before it left the registry, and so waits for it, set its stopped
// flag before that lookup, which this load comes after.
func (p *process) end() {
	if p.stopped.Swap(true) {
		return
	}
	pp := p.hostedParent
	if pp == nil {
		p.terminate()
		return
	}
	p.leave()
	if pp.stopped.Load() {
		p.terminated(p.parent)
	}
}

// deliver is the host handing p one message.
func (p *process) deliver(msg any, sender *actor.PID) {
	switch m := msg.(type) {
	case hostStop:
		defer p.recover(msg)
		if children := p.owner.stopping(); len(children) > 0 {
			p.awaiting = make(map[string]bool, len(children))
			for _, c := range children {
				p.awaiting[c.Id] = true
			}
			return // it terminates once they did
		}
		p.terminate()
		return
	case childGone:
		if p.stopped.Load() && p.awaiting[m.who.Id] {
			delete(p.awaiting, m.who.Id)
			if len(p.awaiting) == 0 {
				p.terminate()
			}
		}
		return // a child's end it did not wait for is nothing to it
	case *actor.PoisonPill: // as an actor's: stop once what came before is handled
		p.Stop(p.self)
		return
	}
	if p.stopped.Load() {
		return // as a stopped actor's dead letters
	}
	defer p.recover(msg)
	p.owner.handle(msg, sender)
}

// recover keeps a host alive when a process's step panics (a bug): the
// process loses that message, logged; a chunk's timer still bounds its
// Finish.
func (p *process) recover(msg any) {
	if r := recover(); r != nil {
		p.env.Log.Error("a chunk or room panicked handling a message; the message is lost",
			zap.String("process", p.self.GetId()), zap.String("message", trace.TypeName(msg)), zap.Any("panic", r))
	}
}

// terminate ends a stopped process: it leaves the registry, and its
// parent and watchers hear that it terminated.
func (p *process) terminate() {
	p.leave()
	p.terminated(p.parent)
}

// leave takes p out of the registry and tells its watchers that it
// terminated.
func (p *process) leave() {
	p.env.System.ProcessRegistry.Remove(p.self)
	p.mu.Lock()
	p.gone = true
	watchers := p.watchers
	p.watchers = nil
	p.mu.Unlock()
	for _, w := range watchers {
		p.terminated(w)
	}
}

// terminated tells to that p terminated, as a stopped actor tells its
// parent and watchers.
func (p *process) terminated(to *actor.PID) {
	if to == nil {
		return
	}
	if q, ok := p.env.System.ProcessRegistry.Get(to); ok {
		q.SendSystemMessage(to, &actor.Terminated{Who: p.self, Why: actor.TerminatedReason_Stopped})
	}
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
	if pp, ok := p.(*process); ok {
		c, _ := pp.owner.(*hostedChunk)
		return c
	}
	return nil
}
