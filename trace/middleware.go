package trace

import (
	"github.com/asynkron/protoactor-go/actor"
)

// Traced is implemented by the engine's actors: their kind and id in a
// trace, and the effects their core returned for the last message.
type Traced interface {
	TraceIdentity() (kind, id string)
	TraceEffects() []any
}

// Unrecorded is implemented by an actor's messages to itself that carry
// nothing to replay: a wake-up whose consequence the actor records itself
// (a submitter's resume, recorded as the Waited of the Work it posts).
type Unrecorded interface {
	Unrecorded()
}

// Middleware records every user message a Traced actor handles, with the
// effects its core returned. protoactor's lifecycle messages and Unrecorded
// messages are left out.
func Middleware(r *Recorder) actor.ReceiverMiddleware {
	return func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			t, ok := c.Actor().(Traced)
			switch env.Message.(type) {
			case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting, *actor.ReceiveTimeout, *actor.Terminated, Unrecorded:
				ok = false
			}
			if !ok {
				next(c, env)
				return
			}
			kind, id := t.TraceIdentity()
			sender := ""
			if env.Sender != nil {
				sender = env.Sender.Id
			}
			slot := r.Begin(kind, id, sender, env.Message)
			// Deferred: a record left open by a panic would end every
			// later snapshot before it (Recorder.Snapshot).
			defer func() { r.Finish(slot, Effects(t.TraceEffects())) }()
			next(c, env)
		}
	}
}

// Effects renders effects as comparable lines.
func Effects(effs []any) []string {
	if len(effs) == 0 {
		return nil
	}
	out := make([]string, len(effs))
	for i, e := range effs {
		out[i] = Effect(e)
	}
	return out
}
