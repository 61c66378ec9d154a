package actors

import (
	"strconv"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/trace"
)

// ForwardProps returns the forward actor's props. It runs on a synchronized
// dispatcher: a message sent from the forward loop is handled on the forward
// loop's goroutine, with no hand-off, unless another sender is inside the
// mailbox at that moment (then that sender's goroutine handles it).
func ForwardProps(env *Env) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &forwardActor{core: NewForwardCore(), fan: fanOut{env: env, byHost: map[uint64]*hostedForward{}}}
	}, env.props(actor.WithDispatcher(actor.NewSynchronizedDispatcher(300)))...)
}

type forwardActor struct {
	core *ForwardCore
	fan  fanOut
	last []Effect
}

// TraceIdentity implements trace.Traced.
func (a *forwardActor) TraceIdentity() (string, string) { return trace.Forward, "forward" }

// TraceEffects implements trace.Traced.
func (a *forwardActor) TraceEffects() []any { return anys(a.last) }

func (a *forwardActor) Receive(ctx actor.Context) {
	a.last = a.core.Step(ctx.Message())
	for _, e := range a.last {
		switch e := e.(type) {
		case FanOut:
			a.fan.deliver(ctx, e)
		case AnswerBegin:
			e.To <- e.N
		}
	}
	if m, ok := ctx.Message().(*messages.End); ok {
		// Every chunk of the forward may have been forgotten (dropped)
		// before its end, and then no ForwardEnd fans out: the grouping
		// made at its Bind goes with its end all the same.
		delete(a.fan.byHost, m.Forward)
		// The ForwardEnd fan-out's targets hold the forward's chunks (a
		// PID caches its process), and its chunks, once they saw it, are
		// never forgotten by message: a step of nothing lets them go
		// rather than the next registration, however long away.
		ctx.Send(ctx.Self(), releaseFanOut)
	}
}

// releaseFan is the forward actor's message to itself after a forward's
// end: its step returns no effect, and the last effects are let go.
type releaseFan struct{}

// Unrecorded implements trace.Unrecorded: it decides nothing.
func (*releaseFan) Unrecorded() {}

var releaseFanOut = &releaseFan{}

// ManagerProps returns the manager actor's props. The manager and its rooms
// run on the engine's Dispatcher, as the chunks do: a Finish called once the
// writes landed crosses manager, room and chunk, and on protoactor's default
// dispatcher each of those hops would start a goroutine per mailbox
// activation; the dispatcher's long-lived workers take that cost off the
// finish path (BenchmarkFinishAfterLanded measures it).
func ManagerProps(env *Env) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &managerActor{env: env, core: NewManagerCore(), rooms: map[uint64]*actor.PID{}}
	}, env.props(actor.WithDispatcher(env.Dispatcher))...)
}

type managerActor struct {
	env   *Env
	core  *ManagerCore
	rooms map[uint64]*actor.PID
	// idle are room processes whose room went idle, kept for the next
	// rooms (at most MaxIdleRooms): a room's stop (a message on its host,
	// the manager hearing it terminate) and the next room's start (a
	// registration in the actor system) are two hops and a registry
	// update per request, paid while other requests' last batches are
	// being posted and answered.
	idle []*actor.PID
	last []Effect
}

// MaxIdleRooms bounds the idle room processes the manager keeps for later
// rooms: a few hundred bytes each, as many as the rooms in flight a prefill
// engine usually has.
const MaxIdleRooms = 1024

// reuseRoom hands an idle room process a new room, ahead of the first
// message the manager routes to it.
type reuseRoom struct{ room uint64 }

// TraceIdentity implements trace.Traced.
func (a *managerActor) TraceIdentity() (string, string) { return trace.Manager, "manager" }

// TraceEffects implements trace.Traced.
func (a *managerActor) TraceEffects() []any { return anys(a.last) }

func (a *managerActor) Receive(ctx actor.Context) {
	a.last = a.core.Step(ctx.Message())
	for _, e := range a.last {
		switch e := e.(type) {
		case SpawnRoom:
			if n := len(a.idle); n > 0 {
				pid := a.idle[n-1]
				a.idle[n-1] = nil
				a.idle = a.idle[:n-1]
				ctx.Send(pid, &reuseRoom{room: e.Room}) // queued before the Route that follows
				a.rooms[e.Room] = pid
			} else {
				a.rooms[e.Room] = ctx.Spawn(roomProps(a.env, e.Room))
			}
		case Route:
			ctx.Send(a.rooms[e.Room], e.Msg)
		case StopRoom:
			// The core stops a room only once it handled every message
			// routed to it and holds no chunk: nothing reaches it until it
			// is handed a new room.
			if pid := a.rooms[e.Room]; len(a.idle) < MaxIdleRooms {
				a.idle = append(a.idle, pid)
			} else {
				ctx.Stop(pid)
			}
			delete(a.rooms, e.Room)
		case AnswerFinish:
			e.To <- e.Result
		case AnswerDrop:
			e.To <- e.Results
		}
	}
}

// roomProps are the props of room's actor: a hosted room (host.go), which
// the manager spawns and addresses as a child, keeps once idle for a later
// room (reuseRoom), and stops, hearing it terminate, beyond MaxIdleRooms or
// with itself; its chunks are its children. A room actor of its own cost a mailbox
// activation per message, and its stop, once its last chunk ended, several
// (the stop, the manager's hearing of it): most of the cost of a request's
// end after its Finish answered, paid while other rooms' last batches were
// still being posted and answered.
func roomProps(env *Env, room uint64) *actor.Props {
	return hostedProps(func(id string, parent *actor.PID) (*actor.PID, error) {
		r := &hostedRoom{core: NewRoomCore(room), room: room, pids: map[messages.Chunk]*actor.PID{}}
		hs := env.hosts()
		return r.register(env, hs[room%uint64(len(hs))], r, id, parent)
	})
}

type hostedRoom struct {
	process
	core *RoomCore
	room uint64
	pids map[messages.Chunk]*actor.PID
}

// stopping stops the room's chunks, as an actor's stop stops its
// children; the room terminates once they did.
func (a *hostedRoom) stopping() (children []*actor.PID) {
	for c, pid := range a.pids {
		delete(a.pids, c)
		if _, live := a.env.System.ProcessRegistry.GetLocal(pid.Id); !live {
			continue // it terminated already: no Terminated will come
		}
		a.root.Stop(pid)
		children = append(children, pid)
	}
	return children
}

// handle steps the room's core; the trace records it as a room actor's
// message when tracing is on.
func (a *hostedRoom) handle(msg any, sender *actor.PID) {
	if m, ok := msg.(*reuseRoom); ok {
		// Idle: no chunk, no Drop waiting (the manager's StopRoom).
		a.room, a.core = m.room, NewRoomCore(m.room)
		return
	}
	if a.step(msg, sender) {
		// The manager may keep this process for a later room: it keeps
		// nothing of this one's.
		a.core.Release()
	}
}

// step steps the room's core and performs its effects, and reports whether
// the room went idle.
func (a *hostedRoom) step(msg any, sender *actor.PID) (idle bool) {
	if rec := a.env.Trace; rec != nil {
		from := ""
		if sender != nil {
			from = sender.Id
		}
		slot := rec.Begin(trace.Room, strconv.FormatUint(a.room, 10), from, msg)
		defer func() { rec.Finish(slot, trace.Effects(anys(a.core.out))) }()
	}
	for _, e := range a.core.Step(msg) {
		switch e := e.(type) {
		case SpawnChunk:
			c := e.Add.Chunk
			pid := e.Add.Start(a.self)
			a.pids[c] = pid
			a.env.Registry.spawned(c, e.Add.PerLayer)
			a.root.Send(a.env.Forward, &messages.Pending{Chunk: c, PID: pid})
		case AnswerRegister:
			e.To <- e.Added
		case Unqueue:
			a.env.Registry.unqueued(e.Chunk)
		case Send:
			a.root.Send(a.pids[e.To], e.Msg)
		case StopChunk:
			// The chunk stopped itself before it told the room it ended
			// (hostedChunk, ChunkEnded).
			delete(a.pids, e.Chunk)
		case AnswerFinish:
			e.To <- e.Result
		case AnswerDrop:
			e.To <- e.Results
		case Idle:
			a.root.Send(a.env.Manager, &messages.RoomIdle{Room: a.room, Seen: e.Seen})
			idle = true
		}
	}
	return idle
}
