package trace

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
)

type tracedActor struct{ handled chan any }

func (a *tracedActor) TraceIdentity() (string, string) { return Chunk, "1:0" }
func (a *tracedActor) TraceEffects() []any             { return nil }
func (a *tracedActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *wakeUp, *recorded:
		a.handled <- m
	}
}

// wakeUp is a self-message with nothing to replay.
type wakeUp struct{}

func (*wakeUp) Unrecorded() {}

type recorded struct{ N int }

// The middleware records what a traced actor handles, except protoactor's
// lifecycle messages and Unrecorded ones.
func TestMiddlewareLeavesOutUnrecorded(t *testing.T) {
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	r := NewRecorder(16, Header{})
	a := &tracedActor{handled: make(chan any, 2)}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return a }, actor.WithReceiverMiddleware(Middleware(r))))
	defer func() { _ = sys.Root.PoisonFuture(pid).Wait() }()
	sys.Root.Send(pid, &wakeUp{})
	sys.Root.Send(pid, &recorded{N: 7})
	for i := 0; i < 2; i++ {
		select {
		case <-a.handled:
		case <-time.After(10 * time.Second):
			t.Fatal("the actor did not handle both messages")
		}
	}
	recs := r.Snapshot().Records
	require.Len(t, recs, 1, "%+v", recs)
	require.Equal(t, "recorded", recs[0].Type)
}
