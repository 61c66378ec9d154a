package actors

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/stderrs"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ChunkProps returns the props of a chunk actor for job.
func ChunkProps(env *Env, job *Job) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &chunkActor{env: env, job: job, core: NewChunkCore(env.Layout, job.Plan)}
	}, env.props(actor.WithDispatcher(env.Dispatcher), actor.WithMailbox(actor.Unbounded()))...)
}

type chunkActor struct {
	env        *Env
	job        *Job
	core       *ChunkCore
	last       []Effect
	timers     []*time.Timer
	stopCancel func() bool // stops watching the Finish caller's context
}

// TraceIdentity implements trace.Traced.
func (a *chunkActor) TraceIdentity() (string, string) { return trace.Chunk, trace.ChunkID(a.job.ID()) }

// TraceEffects implements trace.Traced.
func (a *chunkActor) TraceEffects() []any { return anys(a.last) }

func (a *chunkActor) Receive(ctx actor.Context) {
	a.last = nil
	switch ctx.Message().(type) {
	case *actor.Started, *actor.Stopping, *actor.Restarting:
		return
	case *actor.Stopped:
		a.stopTimer()
		return
	}
	a.last = a.core.Step(ctx.Message())
	for _, e := range a.last {
		a.perform(ctx, e)
	}
}

func (a *chunkActor) perform(ctx actor.Context, e Effect) {
	switch e := e.(type) {
	case Submit:
		a.env.Queued.Add(1)
		ctx.Send(a.env.Submitters, &Work{Work: e.Work, Job: a.job, ReplyTo: ctx.Self()})
	case StartTimer:
		self, root := ctx.Self(), a.env.System.Root
		// A Drop during a Finish arms a second timer: the chunk answers
		// within whichever bound comes first.
		a.timers = append(a.timers, time.AfterFunc(e.After, func() { root.Send(self, &messages.Timeout{}) }))
		if caller := e.Caller; caller != nil {
			a.stopCancel = context.AfterFunc(caller, func() { root.Send(self, &messages.Cancel{Reason: caller.Err()}) })
		}
	case CancelWork:
		a.job.closeGate()
	case Teardown:
		eps, err := a.job.teardown()
		if len(eps) > 0 {
			a.env.Log.Warn("tore down endpoints with writes in flight",
				zap.Uint64("room", a.job.ID().Room), zap.Int("chunk", a.job.ID().Start), zap.Int("endpoints", len(eps)), stderrs.WarnField(err))
		}
		ctx.Send(ctx.Self(), &messages.TornDown{Err: err})
	case Resend:
		a.resend(ctx, e)
	case WatchBatch:
		// One timer per batch watched, stopped with the others when the
		// chunk ends; a watch whose batch completed meanwhile decides
		// nothing in the core.
		self, root, env := ctx.Self(), a.env.System.Root, a.env
		a.timers = append(a.timers, time.AfterFunc(e.After, func() {
			root.Send(self, &messages.BatchOverdue{Seq: e.Seq, Dest: e.Dest, Try: e.Try, InFlight: uint64(max(env.InFlight.Load(), 0))})
		}))
	case AnswerFinish:
		e.To <- e.Result // buffered by the caller
	case Stray:
		a.env.Log.Warn("chunk ignored a "+e.What+" that answers no work it sent (a transport or submitter reporting twice?)",
			zap.Uint64("room", a.job.ID().Room), zap.Int("chunk", a.job.ID().Start), zap.Int("group", e.Seq), zap.Int("destination", e.Dest))
	case ChunkEnded:
		a.stopTimer()
		a.job.closeGate()
		a.env.Registry.ended(e.Result.Chunk)
		a.env.Observer.Chunk(e.Result)
		a.log(e.Result)
		ctx.Send(ctx.Parent(), &messages.ChunkDone{Result: e.Result})
	}
}

// resend quiesces the endpoint a broken batch went on, off the chunk's
// mailbox (a UCX close may drain for up to its bound), and reports
// Quiesced. The chunk answers nothing before it hears back.
func (a *chunkActor) resend(ctx actor.Context, e Resend) {
	self, root, env, job := ctx.Self(), a.env.System.Root, a.env, a.job
	ep := job.brokenEndpoint(e.Seq, e.Dest)
	peer := job.Plan.Dests[e.Dest].Peer
	if ce := env.Log.Check(zap.DebugLevel, "re-sending a broken batch"); ce != nil {
		ce.Write(zap.Uint64("room", job.ID().Room), zap.Int("chunk", job.ID().Start), zap.Int("group", e.Seq), zap.Int("destination", e.Dest), zap.Error(e.Cause))
	}
	go func() {
		err := quiesce(ep)
		// A fenced Close (rdma.ErrFenced) resumes too: the re-send's
		// landing ends what may still land of the broken endpoint.
		if err == nil || fenced(err) {
			if e.After > 0 {
				// Bounded by the core (ResendBackoff), far below any finish
				// timeout; a timeout or Drop meanwhile waits for Quiesced.
				time.Sleep(e.After)
			}
			if lost := env.Peers.Lost(peer); lost != nil && err != nil {
				err = errors.WithSecondaryError(errors.Mark(lost, rdma.ErrNotQuiesced), err)
			} else if lost != nil {
				err = lost
			}
		}
		if err != nil && !fenced(err) {
			env.Log.Warn("cannot resume a broken batch", zap.Uint64("room", job.ID().Room), zap.Int("chunk", job.ID().Start),
				zap.Int("group", e.Seq), zap.Int("destination", e.Dest), stderrs.WarnField(err))
		}
		root.Send(self, &messages.Quiesced{Seq: e.Seq, Dest: e.Dest, Err: err})
	}()
}

// quiesce closes ep, on which a batch broke, and says whether the
// transport confirmed that nothing posted on it can land any more.
func quiesce(ep rdma.Endpoint) error {
	if ep == nil {
		return errors.Mark(errors.New("the broken batch's endpoint is unknown, so its quiescence cannot be confirmed"), rdma.ErrNotQuiesced)
	}
	if err := ep.Close(); errors.Is(err, rdma.ErrNotQuiesced) {
		return errors.Wrap(err, "quiesce the broken endpoint")
	}
	// Any other Close error still ends the endpoint's writes: the contract
	// lets only ErrNotQuiesced say otherwise.
	return nil
}

func (a *chunkActor) stopTimer() {
	for _, t := range a.timers {
		t.Stop()
	}
	a.timers = nil
	if a.stopCancel != nil {
		a.stopCancel()
		a.stopCancel = nil
	}
}

// log follows invariant 12: success at DEBUG, failure at WARN with room,
// chunk and cause; nothing per layer.
func (a *chunkActor) log(r messages.Result) {
	// Checked before the fields are built: a success at DEBUG is usually
	// disabled, and this runs between the last landing and Finish's return.
	ce := a.env.Log.Check(LogLevel(r), logMessage(r))
	if ce == nil {
		return
	}
	fields := []zap.Field{
		zap.Uint64("room", r.Chunk.Room), zap.Int("chunk", r.Chunk.Start),
		zap.Bool("per_layer", r.PerLayer), zap.String("status", r.Status.String()),
		zap.Uint64("bytes", r.Stats.Bytes), zap.Int("batches", r.Stats.Batches), zap.Int("groups", r.Stats.Groups),
	}
	if r.Stats.Resent > 0 {
		fields = append(fields, zap.Int("resent", r.Stats.Resent))
	}
	if r.Err != nil {
		fields = append(fields, stderrs.WarnField(r.Err)) // logged at WARN
	}
	ce.Write(fields...)
}

// LogLevel is the level a chunk's end is logged at (invariant 12: quiet
// success, loud failure): DEBUG when it succeeded, WARN when it carries an
// error (failed, or a drop that could not quiesce).
func LogLevel(r messages.Result) zapcore.Level {
	if r.Err != nil {
		return zapcore.WarnLevel
	}
	return zapcore.DebugLevel
}

func logMessage(r messages.Result) string {
	if r.Err != nil {
		return "chunk transfer failed"
	}
	return "chunk transfer done"
}
