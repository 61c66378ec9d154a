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
}

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
	last  []Effect
}

// TraceIdentity implements trace.Traced.
func (a *managerActor) TraceIdentity() (string, string) { return trace.Manager, "manager" }

// TraceEffects implements trace.Traced.
func (a *managerActor) TraceEffects() []any { return anys(a.last) }

func (a *managerActor) Receive(ctx actor.Context) {
	a.last = a.core.Step(ctx.Message())
	for _, e := range a.last {
		switch e := e.(type) {
		case SpawnRoom:
			a.rooms[e.Room] = ctx.Spawn(roomProps(a.env, e.Room))
		case Route:
			ctx.Send(a.rooms[e.Room], e.Msg)
		case StopRoom:
			ctx.Stop(a.rooms[e.Room])
			delete(a.rooms, e.Room)
		case AnswerFinish:
			e.To <- e.Result
		case AnswerDrop:
			e.To <- e.Results
		}
	}
}

func roomProps(env *Env, room uint64) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &roomActor{env: env, core: NewRoomCore(room), room: room, pids: map[messages.Chunk]*actor.PID{}}
	}, env.props(actor.WithDispatcher(env.Dispatcher))...)
}

type roomActor struct {
	env  *Env
	core *RoomCore
	room uint64
	pids map[messages.Chunk]*actor.PID
	last []Effect
}

// TraceIdentity implements trace.Traced.
func (a *roomActor) TraceIdentity() (string, string) {
	return trace.Room, strconv.FormatUint(a.room, 10)
}

// TraceEffects implements trace.Traced.
func (a *roomActor) TraceEffects() []any { return anys(a.last) }

func (a *roomActor) Receive(ctx actor.Context) {
	a.last = a.core.Step(ctx.Message())
	for _, e := range a.last {
		switch e := e.(type) {
		case SpawnChunk:
			c := e.Add.Chunk
			pid := ctx.Spawn(e.Add.Props)
			a.pids[c] = pid
			a.env.Registry.spawned(c, e.Add.PerLayer)
			ctx.Send(a.env.Forward, &messages.Pending{Chunk: c, PID: pid})
		case AnswerRegister:
			e.To <- e.Added
		case Unqueue:
			a.env.Registry.unqueued(e.Chunk)
		case Send:
			ctx.Send(a.pids[e.To], e.Msg)
		case StopChunk:
			ctx.Stop(a.pids[e.Chunk])
			delete(a.pids, e.Chunk)
			ctx.Send(a.env.Forward, &messages.Forget{Chunk: e.Chunk})
		case AnswerFinish:
			e.To <- e.Result
		case AnswerDrop:
			e.To <- e.Results
		case Idle:
			ctx.Send(a.env.Manager, &messages.RoomIdle{Room: a.room, Seen: e.Seen})
		}
	}
}
