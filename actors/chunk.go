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

// ChunkProps returns the props that start the chunk context of job under
// the actor that spawns it (StartChunk, for an actor context).
func ChunkProps(env *Env, job *Job) *actor.Props {
	return hostedProps(func(id string, parent *actor.PID) (*actor.PID, error) {
		c := newHostedChunk(env, job)
		return c.register(env, env.hostOf(job.ID()), c, id, parent)
	})
}

// StartChunk returns what starts the chunk context of job under its room
// (messages.AddChunk.Start): a hosted chunk (host.go), which its room
// addresses and stops as a child and hears terminate.
func StartChunk(env *Env, job *Job) func(parent *actor.PID) *actor.PID {
	return func(parent *actor.PID) *actor.PID {
		c := newHostedChunk(env, job)
		pid, err := c.register(env, env.hostOf(job.ID()), c, childID(env, parent), parent)
		if err != nil { // a fresh id cannot exist: the registry's sequence made it
			env.Log.Error("cannot register a chunk context", zap.Uint64("room", job.ID().Room), zap.Int("chunk", job.ID().Start), zap.Error(err))
			return nil
		}
		return pid
	}
}

func newHostedChunk(env *Env, job *Job) *hostedChunk {
	return &hostedChunk{job: job, core: NewChunkCore(env.Layout, job.Plan)}
}

// hostedChunk is one chunk context: its core and what its shell keeps,
// which only its host's activation touches.
type hostedChunk struct {
	process
	job        *Job
	core       *ChunkCore
	timers     []*time.Timer
	stopCancel func() bool // stops watching the Finish caller's context
	ended      bool        // it performed ChunkEnded: it stops after this step
}

// stopping stops its timers and closes its job's gate (a chunk stopped
// before it ended, by its room's stop, posts nothing more): it takes no
// message any more.
func (c *hostedChunk) stopping() []*actor.PID {
	c.stopTimer()
	c.job.closeGate()
	return nil
}

// handle steps the core with one message and performs its effects; the
// trace records it as a chunk actor's message when tracing is on.
func (c *hostedChunk) handle(msg any, sender *actor.PID) {
	if rec := c.env.Trace; rec != nil {
		from := ""
		if sender != nil {
			from = sender.Id
		}
		slot := rec.Begin(trace.Chunk, trace.ChunkID(c.job.ID()), from, msg)
		defer func() { rec.Finish(slot, trace.Effects(anys(c.core.out))) }()
	}
	// Deferred: a panic in a later effect (a bug, recovered by the host)
	// must not leave registered a chunk its room counts as ended.
	defer func() {
		if c.ended {
			c.end()
		}
	}()
	effs := c.core.Step(msg)
	for _, e := range effs {
		c.perform(e)
	}
}

func (c *hostedChunk) perform(e Effect) {
	switch e := e.(type) {
	case Submit:
		c.env.Queued.Add(1)
		c.root.Send(c.env.Submitters, &Work{Work: e.Work, Job: c.job, ReplyTo: c.self})
	case StartTimer:
		self, root := c.self, c.root
		// A Drop during a Finish arms a second timer: the chunk answers
		// within whichever bound comes first.
		c.timers = append(c.timers, time.AfterFunc(e.After, func() { root.Send(self, &messages.Timeout{}) }))
		// A context that can never end (context.Background) needs no
		// watch: three allocations fewer per Finish.
		if caller := e.Caller; caller != nil && caller.Done() != nil {
			c.stopCancel = context.AfterFunc(caller, func() { root.Send(self, &messages.Cancel{Reason: caller.Err()}) })
		}
	case CancelWork:
		c.job.closeGate()
	case Teardown:
		// Closed here, so that no post starts after this message; the
		// endpoints' closes (a UCX close drains for up to its bound) run
		// off the host, and TornDown reports back.
		c.job.closeGate()
		self, root, env, job := c.self, c.root, c.env, c.job
		go func() {
			eps, err := job.teardown()
			if len(eps) > 0 {
				env.Log.Warn("tore down endpoints with writes in flight",
					zap.Uint64("room", job.ID().Room), zap.Int("chunk", job.ID().Start), zap.Int("endpoints", len(eps)), stderrs.WarnField(err))
			}
			root.Send(self, &messages.TornDown{Err: err})
		}()
	case Resend:
		c.resend(e)
	case WatchBatch:
		// One timer per batch watched, stopped with the others when the
		// chunk ends; a watch whose batch completed meanwhile decides
		// nothing in the core.
		self, root, env := c.self, c.root, c.env
		c.timers = append(c.timers, time.AfterFunc(e.After, func() {
			root.Send(self, &messages.BatchOverdue{Seq: e.Seq, Dest: e.Dest, Try: e.Try, InFlight: uint64(max(env.InFlight.Load(), 0))})
		}))
	case AnswerFinish:
		e.To <- e.Result // buffered by the caller
	case Stray:
		c.env.Log.Warn("chunk ignored a "+e.What+" that answers no work it sent (a transport or submitter reporting twice?)",
			zap.Uint64("room", c.job.ID().Room), zap.Int("chunk", c.job.ID().Start), zap.Int("group", e.Seq), zap.Int("destination", e.Dest))
	case ChunkEnded:
		c.stopTimer()
		c.job.closeGate()
		c.env.Registry.ended(e.Result.Chunk)
		c.env.Observer.Chunk(e.Result)
		c.log(e.Result)
		if e.Forget && c.env.Forward != nil { // no forward actor: a chunk outside an engine (tests)
			c.root.Send(c.env.Forward, &messages.Forget{Chunk: e.Result.Chunk})
		}
		c.root.Send(c.parent, &messages.ChunkDone{Result: e.Result})
		// It stops itself once this step's effects are performed (the
		// answer to its Finish included): its room need not stop it, nor
		// wait to hear it terminate, two hops per request between its last
		// landing and the room's end. What reaches it from now on is
		// dropped, as a stopped actor's.
		c.ended = true
	}
}

// resend quiesces the endpoint a broken batch went on, off the chunk's
// mailbox (a UCX close may drain for up to its bound), and reports
// Quiesced. The chunk answers nothing before it hears back.
func (c *hostedChunk) resend(e Resend) {
	self, root, env, job := c.self, c.root, c.env, c.job
	job.writeOff(e.Seq, e.Dest) // a written-off batch's completion may never come
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

func (c *hostedChunk) stopTimer() {
	for _, t := range c.timers {
		t.Stop()
	}
	c.timers = nil
	if c.stopCancel != nil {
		c.stopCancel()
		c.stopCancel = nil
	}
}

// log follows invariant 12: success at DEBUG, failure at WARN with room,
// chunk and cause; nothing per layer.
func (c *hostedChunk) log(r messages.Result) {
	// Checked before the fields are built: a success at DEBUG is usually
	// disabled, and this runs between the last landing and Finish's return.
	ce := c.env.Log.Check(LogLevel(r), logMessage(r))
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
