package actors

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/messages"
)

// fanOut delivers the forward core's FanOut effects. A forward's chunks are
// grouped by host once, at its Bind, and each later boundary and its end
// take one queue entry per host that holds any of them: the forward thread's
// cost per boundary is a push per host, and no message is made per chunk
// (host.go). Bind, boundaries and end all go through the hosts' queues, so
// a chunk sees them in the order the forward thread sent them, and its Bind
// is queued before BeginForward returns, ahead of anything its room sends
// it later. A target that is not a hosted chunk gets the message sent.
type fanOut struct {
	env     *Env
	byHost  map[uint64]*hostedForward
	scratch [][]*hostedChunk
}

// hostedForward is a forward's chunks, per host, and its other targets.
type hostedForward struct {
	hosts  []*chunkHost
	chunks [][]*hostedChunk // per entry of hosts
	direct []*actor.PID
}

func (f *fanOut) deliver(ctx actor.Context, e FanOut) {
	var fw *hostedForward
	switch m := e.Msg.(type) {
	case *messages.Bind:
		fw = f.group(e.To)
		f.byHost[m.Forward] = fw
	case *messages.GroupReady:
		fw = f.byHost[m.Forward]
	case *messages.ForwardEnd:
		fw = f.byHost[m.Forward]
		delete(f.byHost, m.Forward)
	}
	if fw == nil { // a forward bound before this shell grouped it: cannot happen, but never lose a message
		for _, t := range e.To {
			ctx.Send(t.PID, e.Msg)
		}
		return
	}
	for i, h := range fw.hosts {
		h.push(hostItem{to: fw.chunks[i], msg: e.Msg})
	}
	for _, pid := range fw.direct {
		ctx.Send(pid, e.Msg)
	}
}

// group sorts a forward's targets by host, keeping their order within each.
func (f *fanOut) group(to []Target) *hostedForward {
	hs := f.env.hosts()
	if f.scratch == nil {
		f.scratch = make([][]*hostedChunk, len(hs))
	}
	fw := &hostedForward{}
	for _, t := range to {
		c := f.env.hostedOf(t.PID)
		if c == nil {
			fw.direct = append(fw.direct, t.PID)
			continue
		}
		for i, h := range hs {
			if h == c.host {
				f.scratch[i] = append(f.scratch[i], c)
				break
			}
		}
	}
	for i, h := range hs {
		if len(f.scratch[i]) > 0 {
			fw.hosts = append(fw.hosts, h)
			fw.chunks = append(fw.chunks, f.scratch[i])
			f.scratch[i] = nil
		}
	}
	return fw
}
