package actors

import (
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

type quietObserver struct{}

func (quietObserver) Batch(Batch)             {}
func (quietObserver) Chunk(messages.Result)   {}
func (quietObserver) Restarted(reason string) {}

// hostedRig is an actor system with an Env, and a parent actor that spawns
// hosted chunks as a room does and reports what it hears.
type hostedRig struct {
	env        *Env
	parent     *actor.PID
	spawned    chan *actor.PID
	terminated chan *actor.PID
	parentGone bool // the test stopped the parent itself
}

func newHostedRig(t *testing.T) *hostedRig {
	l, err := plan.NewLayout([]plan.Buffer{{Name: "KV0", Base: 1 << 20, ItemLen: 64, Pages: 8, Layer: 0}}, []rdma.LocalKey{1}, 1, 1, 16, cp.CP{Size: 1})
	require.NoError(t, err)
	sys := actor.NewActorSystem()
	r := &hostedRig{
		env:        &Env{System: sys, Log: zap.NewNop(), Layout: l, Registry: NewRegistry(), Dispatcher: NewDispatcher(2), Observer: quietObserver{}},
		spawned:    make(chan *actor.PID, 8),
		terminated: make(chan *actor.PID, 8),
	}
	r.parent = sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *Job:
			r.spawned <- ctx.Spawn(ChunkProps(r.env, m))
		case *actor.Terminated:
			r.terminated <- m.Who
		}
	}))
	t.Cleanup(func() {
		if !r.parentGone {
			require.NoError(t, sys.Root.StopFuture(r.parent).Wait())
		}
		r.env.Dispatcher.Close()
		sys.Shutdown()
	})
	return r
}

// chunk spawns a hosted chunk of an empty plan (it answers a Finish at
// once) under the parent.
func (r *hostedRig) chunk(room uint64) (*actor.PID, *hostedChunk) {
	r.env.System.Root.Send(r.parent, NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: room}, Serial: room}}))
	pid := <-r.spawned
	return pid, r.env.hostedOf(pid)
}

// A hosted chunk takes its messages through its host, and stops as an
// actor does: its parent and a StopFuture's watch hear it terminated, it
// leaves the registry, and what is sent to it afterwards is dropped. One
// that answered its Finish stops itself, and its parent hears that too.
func TestHostedChunkLivesAndStopsLikeAnActor(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // after the rig's cleanup
	r := newHostedRig(t)
	pid, c := r.chunk(1)
	require.NotNil(t, c, "the PID names a hosted chunk")
	require.NoError(t, r.env.System.Root.StopFuture(pid).Wait(), "the watch of a StopFuture is told")
	assert.True(t, pid.Equal(<-r.terminated), "the parent is told")
	assert.Nil(t, r.env.hostedOf(pid), "it left the registry")
	assert.True(t, c.stopped.Load())
	// A message after the stop reaches the process through the PID's cached
	// reference and is dropped: the core never sees it.
	reply := make(chan messages.Result, 2)
	c.deliver(&messages.Finish{Room: 1, Timeout: time.Minute, Reply: reply}, nil)
	assert.Empty(t, reply)

	answered, c := r.chunk(2)
	require.NotNil(t, c)
	r.env.System.Root.Send(answered, &messages.Finish{Room: 2, Timeout: time.Minute, Reply: reply})
	res := <-reply
	assert.Equal(t, messages.Succeeded, res.Status)
	assert.True(t, answered.Equal(<-r.terminated), "a chunk that answered stopped itself, and its parent is told")
	assert.Nil(t, r.env.hostedOf(answered), "it left the registry")
	require.NoError(t, r.env.System.Root.StopFuture(answered).Wait(), "a watch after it ended is told at once")
	c.deliver(&messages.Finish{Room: 2, Timeout: time.Minute, Reply: reply}, nil)
	assert.Empty(t, reply, "what reaches it after it ended is dropped")
}

// A PoisonPill stops it after what was queued before it, and a room (the
// parent) stopping stops its chunks.
func TestHostedChunkPoisonAndParentStop(t *testing.T) {
	r := newHostedRig(t)
	pid, _ := r.chunk(1)
	reply := make(chan messages.Result, 1)
	r.env.System.Root.Send(pid, &messages.Finish{Room: 1, Timeout: time.Minute, Reply: reply})
	require.NoError(t, r.env.System.Root.PoisonFuture(pid).Wait())
	assert.Len(t, reply, 1, "the Finish queued before the pill was handled")
	assert.True(t, pid.Equal(<-r.terminated))

	second, c := r.chunk(2)
	require.NoError(t, r.env.System.Root.StopFuture(r.parent).Wait(), "the parent's stop waits for its chunk")
	assert.True(t, c.stopped.Load())
	assert.Nil(t, r.env.hostedOf(second))
	r.parentGone = true
}

// A room stops as an actor stops: its chunks first (their jobs' gates
// closed: a chunk stopped before it ended posts nothing more), and its
// stop's future resolves only once they terminated.
func TestHostedRoomStopsItsChunksFirst(t *testing.T) {
	r := newHostedRig(t)
	env := r.env
	env.Forward = env.System.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {})) // takes Pending and Forget
	rooms := make(chan *actor.PID, 1)
	manager := env.System.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*actor.Started); ok {
			rooms <- ctx.Spawn(roomProps(env, 7))
		}
	}))
	defer func() { require.NoError(t, env.System.Root.StopFuture(manager).Wait()) }()
	room := <-rooms
	job := NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: 7}, Serial: 9}})
	added := make(chan messages.Added, 1)
	env.System.Root.Send(room, &messages.AddChunk{Chunk: job.ID(), Start: StartChunk(env, job), Reply: added})
	require.Equal(t, job.ID(), (<-added).Chunk)

	require.NoError(t, env.System.Root.StopFuture(room).Wait())
	job.mu.Lock()
	closed := job.closed
	job.mu.Unlock()
	assert.True(t, closed, "the chunk's gate closed before its room's stop returned")
	assert.Error(t, job.Context().Err())
}

// watchedManager is the manager actor, telling the test how many idle
// room processes it keeps each time it handled a RoomIdle (on its own
// goroutine, so the test reads nothing of it while it runs).
type watchedManager struct {
	*managerActor
	idle chan int
}

func (w *watchedManager) Receive(ctx actor.Context) {
	w.managerActor.Receive(ctx)
	if _, ok := ctx.Message().(*messages.RoomIdle); ok {
		w.idle <- len(w.managerActor.idle)
	}
}

// A room that went idle is not stopped but kept, and the next room takes
// its process: the new room's chunks are its children, its Finish answers
// for its own chunk, and what the old room held is gone.
func TestIdleRoomProcessServesTheNextRoom(t *testing.T) {
	r := newHostedRig(t)
	env := r.env
	env.Forward = env.System.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {})) // takes Pending and Forget
	idle := make(chan int, 4)
	manager := env.System.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &watchedManager{managerActor: &managerActor{env: env, core: NewManagerCore(), rooms: map[uint64]*actor.PID{}}, idle: idle}
	}, actor.WithDispatcher(env.Dispatcher)))
	defer func() { require.NoError(t, env.System.Root.StopFuture(manager).Wait()) }()
	env.Manager = manager

	register := func(room uint64) (parent *actor.PID) {
		job := NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: room}, Serial: room}})
		parents := make(chan *actor.PID, 1)
		start := StartChunk(env, job)
		added := make(chan messages.Added, 1)
		env.System.Root.Send(manager, &messages.AddChunk{Chunk: job.ID(), Reply: added, Start: func(p *actor.PID) *actor.PID {
			parents <- p
			return start(p)
		}})
		require.Equal(t, job.ID(), (<-added).Chunk)
		return <-parents
	}
	finish := func(room uint64) messages.Result {
		reply := make(chan messages.Result, 1)
		env.System.Root.Send(manager, &messages.Finish{Room: room, Timeout: time.Minute, Reply: reply})
		return <-reply
	}

	first := register(1)
	res := finish(1)
	require.Equal(t, messages.Succeeded, res.Status)
	require.Equal(t, 1, <-idle, "room 1 went idle, and its process is kept")

	second := register(2)
	assert.True(t, first.Equal(second), "room 2 took room 1's process")
	res = finish(2)
	assert.Equal(t, messages.Succeeded, res.Status)
	assert.Equal(t, uint64(2), res.Chunk.Room, "the Finish answered for room 2's chunk")
	require.Equal(t, 1, <-idle)
	res = finish(1)
	assert.Equal(t, messages.Failed, res.Status, "room 1 has no chunk any more")
	assert.True(t, errors.Is(res.Err, ErrNoChunk), "%v", res.Err)
}

// A forward whose every chunk was forgotten before its end keeps nothing:
// the shell's grouping of its chunks goes with its End, with no ForwardEnd
// to fan out.
func TestForwardOfForgottenChunksKeepsNothing(t *testing.T) {
	fw, _, c, step := boundForward(t)
	require.Len(t, fw.fan.byHost, 1, "its chunks grouped at its Bind")
	step(&messages.Forget{Chunk: c.job.ID()})
	step(&messages.End{Forward: 1})
	assert.Empty(t, fw.fan.byHost)
}

// boundForward is a forward actor stepped by hand (step), with one hosted
// chunk bound to its forward 1; ctx records what it sends.
func boundForward(t *testing.T) (*forwardActor, *serveCtx, *hostedChunk, func(any)) {
	r := newHostedRig(t)
	pid, c := r.chunk(1)
	require.NotNil(t, c)
	fw := &forwardActor{core: NewForwardCore(), fan: fanOut{env: r.env, byHost: map[uint64]*hostedForward{}}}
	ctx := &serveCtx{self: actor.NewPID("local", "forward")}
	step := func(m any) { fw.Receive(&messageCtx{serveCtx: ctx, msg: m}) }
	step(&messages.Pending{Chunk: c.job.ID(), PID: pid})
	step(&messages.Begin{Forward: 1})
	return fw, ctx, c, step
}

// messageCtx is a context whose message is msg.
type messageCtx struct {
	*serveCtx
	msg any
}

func (c *messageCtx) Message() any { return c.msg }

// A forward's end lets its chunks go: its chunks are not forgotten by
// message once they saw its end, so the forward actor sends itself a step
// of nothing after the End's fan-out, and holds no target afterwards.
func TestForwardEndLetsItsChunksGo(t *testing.T) {
	fw, ctx, _, step := boundForward(t)
	step(&messages.End{Forward: 1})
	require.NotEmpty(t, fw.last, "the End fanned out ForwardEnd to the chunk")
	require.Len(t, ctx.sent, 1, "the forward actor sent itself one message")
	step(ctx.sent[0])
	assert.Empty(t, fw.last)
	for _, e := range fw.core.out[:cap(fw.core.out)] {
		assert.Nil(t, e, "the core's last effects were cleared")
	}
	assert.Empty(t, fw.core.Active(1))
	assert.Empty(t, fw.core.Pending())
}

type spawnRoom struct{}

// A chunk that ends itself while its room stops: the room waits for it only
// if its stop found it still registered, and then hears it terminate, so
// the room's stop always completes, whichever comes first.
func TestRoomStopRacingItsChunksEnd(t *testing.T) {
	r := newHostedRig(t)
	env := r.env
	env.Forward = env.System.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {})) // takes Pending and Forget
	rooms := make(chan *actor.PID, 1)
	manager := env.System.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(spawnRoom); ok {
			rooms <- ctx.Spawn(roomProps(env, 7))
		}
	}))
	defer func() { require.NoError(t, env.System.Root.StopFuture(manager).Wait()) }()
	for i := range 500 {
		env.System.Root.Send(manager, spawnRoom{})
		room := <-rooms
		job := NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: 7}, Serial: uint64(i + 1)}})
		added := make(chan messages.Added, 1)
		env.System.Root.Send(room, &messages.AddChunk{Chunk: job.ID(), Start: StartChunk(env, job), Reply: added})
		require.Equal(t, job.ID(), (<-added).Chunk)
		reply := make(chan messages.Result, 1)
		// The Finish ends the chunk (an empty plan answers at once), which
		// answers before it stops: its stop on its host races the room's
		// on the room's (a stop issued before the room handled the Finish
		// would drop it).
		env.System.Root.Send(room, &messages.Finish{Room: 7, Timeout: time.Minute, Reply: reply})
		require.Equal(t, messages.Succeeded, (<-reply).Status)
		require.NoError(t, env.System.Root.StopFuture(room).Wait(), "round %d: the room's stop completes (within the future's 10 s)", i)
	}
}

type nopHosted struct{}

func (nopHosted) handle(any, *actor.PID) {}
func (nopHosted) stopping() []*actor.PID { return nil }

// A chunk that ends itself tells its hosted room only while the room
// stops (the one time a room waits for its children): a room whose stop
// found the chunk still registered set its stopped flag before, and hears
// it terminate. The hosts here never run: the test reads their queues.
func TestEndedChunkTellsOnlyAStoppingRoom(t *testing.T) {
	r := newHostedRig(t)
	env := r.env
	roomHost, chunkHost := &chunkHost{env: env, scheduled: true}, &chunkHost{env: env, scheduled: true}
	room := &process{}
	roomPID, err := room.register(env, roomHost, nopHosted{}, "room-under-test", nil)
	require.NoError(t, err)
	end := func(id string) *actor.PID {
		c := &process{}
		pid, err := c.register(env, chunkHost, nopHosted{}, id, roomPID)
		require.NoError(t, err)
		require.Same(t, room, c.hostedParent)
		c.end()
		assert.True(t, c.stopped.Load())
		_, live := env.System.ProcessRegistry.GetLocal(id)
		assert.False(t, live, "it left the registry")
		return pid
	}
	queued := func() []hostItem {
		roomHost.mu.Lock()
		defer roomHost.mu.Unlock()
		return slices.Clone(roomHost.queue)
	}

	end("chunk-a")
	assert.Empty(t, queued(), "a room that is not stopping is told nothing")

	room.stopped.Store(true) // as its Stop does, before its host runs the stop
	b := end("chunk-b")
	q := queued()
	require.Len(t, q, 1, "a stopping room hears it terminate")
	gone, ok := q[0].msg.(childGone)
	require.True(t, ok, "%T", q[0].msg)
	assert.True(t, b.Equal(gone.who))
	env.System.ProcessRegistry.Remove(roomPID)
}
