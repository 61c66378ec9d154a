package actors

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
)

// Work is what a submitter receives: the Work a chunk's core decided, with
// the chunk's job (its plan, gate and cancellation) and the chunk's
// address attached by the chunk's shell. The job is a typed field rather
// than a value in messages, which cannot know the job's type.
type Work struct {
	messages.Work
	Job     *Job
	ReplyTo *actor.PID
}

// Job is the data-plane half of a chunk context, shared by its actor and the
// submitters that serve it: the plan, a context that cancels event waits,
// and a gate with a ledger of the batches in flight per endpoint.
//
// The gate is the one lock between the chunk and its submitters, and it is
// what makes quiescence exact (invariant 10): a submitter posts only while
// holding it and only if the gate is open; closing it therefore orders every
// future post after the close (they are skipped), and the ledger names every
// endpoint that can still land a write of this chunk.
type Job struct {
	Plan   *plan.Plan
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	inflight map[rdma.Endpoint]int
	// last is where each Work (seq, dest) was last posted: the endpoint a
	// batch that broke must be quiesced on before the Work is re-sent, and
	// the bytes the batch holds in the engine's count in flight.
	last map[[2]int]lastPost
	// stopped is told, once, when the job stops accepting work (its
	// context is cancelled): the submitters' ready hub, so that its Works
	// leave their event's wait at once.
	stopped   func()
	isStopped bool
}

// NewJob returns the job of plan.
func NewJob(p *plan.Plan) *Job {
	ctx, cancel := context.WithCancel(context.Background())
	return &Job{Plan: p, ctx: ctx, cancel: cancel, inflight: map[rdma.Endpoint]int{}}
}

// ID returns the chunk.
func (j *Job) ID() messages.Chunk { return j.Plan.Chunk }

// TraceName implements trace naming: a trace names a job by its chunk.
func (j *Job) TraceName() string { return trace.ChunkID(j.ID()) }

// Context is cancelled when the chunk stops accepting work.
func (j *Job) Context() context.Context { return j.ctx }

// Release frees a job whose chunk was never started (its key was already
// registered).
func (j *Job) Release() { j.stop() }

// stop cancels the job's context and tells its onStop hook.
func (j *Job) stop() {
	j.cancel()
	j.mu.Lock()
	f := j.stopped
	j.stopped, j.isStopped = nil, true
	j.mu.Unlock()
	if f != nil {
		f()
	}
}

// onStop sets what stop tells, and reports false (setting nothing) if the
// job stopped already. The caller may hold locks that f takes: stop calls
// f with no lock of the job's held.
func (j *Job) onStop(f func()) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.isStopped {
		return false
	}
	j.stopped = f
	return true
}

// post posts ws on ep unless the gate is closed; posted reports whether a
// batch is now in flight. done runs when it completes (never inside post,
// by the transport contract, so holding the gate across Post is safe).
func (j *Job) post(seq, dest int, ep rdma.Endpoint, ws []rdma.Write, held *heldBytes, done func(error)) (posted bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return false, nil
	}
	err = ep.Post(ws, func(err error) {
		j.completed(ep)
		done(err)
	})
	if err != nil {
		return false, err
	}
	j.inflight[ep]++
	if j.last == nil {
		j.last = map[[2]int]lastPost{}
	}
	j.last[[2]int{seq, dest}] = lastPost{ep: ep, held: held}
	return true, nil
}

// lastPost is where a Work's last batch went (Job.last).
type lastPost struct {
	ep   rdma.Endpoint
	held *heldBytes
}

// heldBytes are a posted batch's bytes in the engine's count of bytes in
// flight (Env.InFlight), given back once: by the batch's completion, or
// when its chunk writes it off (a lost completion may never come, and
// bytes it held for ever would make every later watch take the link for a
// slow one: "slow is not lost").
type heldBytes struct {
	n        int64
	in       *atomic.Int64
	released atomic.Bool
}

func (h *heldBytes) release() {
	if h != nil && h.released.CompareAndSwap(false, true) {
		h.in.Add(-h.n)
	}
}

// writeOff gives back the bytes the Work (seq, dest)'s last batch holds in
// flight: its chunk re-sends it (a completion that comes later gives
// nothing back twice).
func (j *Job) writeOff(seq, dest int) {
	j.mu.Lock()
	held := j.last[[2]int{seq, dest}].held
	j.mu.Unlock()
	held.release()
}

// completed records that one of its batches on ep completed.
func (j *Job) completed(ep rdma.Endpoint) {
	j.mu.Lock()
	if j.inflight[ep]--; j.inflight[ep] <= 0 {
		delete(j.inflight, ep)
	}
	j.mu.Unlock()
}

// brokenEndpoint returns the endpoint the Work (seq, dest) was last posted
// on, or nil.
func (j *Job) brokenEndpoint(seq, dest int) rdma.Endpoint {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.last[[2]int{seq, dest}].ep
}

// closeGate stops new posts and wakes event waits.
func (j *Job) closeGate() {
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	j.stop()
}

// teardown closes the gate and tears down every endpoint with a batch of
// this chunk in flight. When it returns, nothing of the chunk can land,
// unless it returns an error marked rdma.ErrNotQuiesced. Other chunks'
// batches on those endpoints fail too: the transport cannot cancel one
// batch, only an endpoint (UCX force close, verbs QP to error).
func (j *Job) teardown() (eps []rdma.Endpoint, err error) {
	j.mu.Lock()
	j.closed = true
	eps = make([]rdma.Endpoint, 0, len(j.inflight))
	for ep := range j.inflight {
		eps = append(eps, ep)
	}
	j.mu.Unlock()
	j.stop()
	// In parallel: a Close may drain for up to the transport's bound (UCX:
	// CloseDrain), and one after another they would add up past the
	// finish timeout's reserve.
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() { errs[i] = ep.Close() })
	}
	wg.Wait()
	for _, cerr := range errs {
		if errors.Is(cerr, rdma.ErrNotQuiesced) {
			err = errors.CombineErrors(err, cerr)
		}
	}
	return eps, err
}
