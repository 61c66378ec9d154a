package workload

import (
	"context"
	"fmt"
	"time"

	"github.com/kvstream/kvstream/system"
)

// stopper is how a run stops early when its operator asks: a drain (Config
// Drain closed) starts no request and schedules the remaining chunks of
// every request already started; an interrupt (the run's context ended)
// launches no forward after the current one, whose chunks still finish.
// Either way the report counts what was done.
type stopper struct {
	ctx     context.Context
	drain   <-chan struct{}
	started []bool
}

func newStopper(ctx context.Context, drain <-chan struct{}, requests int) *stopper {
	return &stopper{ctx: ctx, drain: drain, started: make([]bool, requests)}
}

func (s *stopper) draining() bool {
	select {
	case <-s.drain:
		return true
	default:
		return false
	}
}

// keep returns the chunks of forward fw the run still schedules: all of
// them until a drain; then only those of requests already started.
func (s *stopper) keep(fw []piece) []piece {
	if !s.draining() {
		for _, pc := range fw {
			s.started[pc.room] = true
		}
		return fw
	}
	out := fw[:0:0]
	for _, pc := range fw {
		if s.started[pc.room] {
			out = append(out, pc)
		}
	}
	return out
}

// interrupted says why no forward after forward k (1-based) is launched,
// or "" when the run goes on.
func (s *stopper) interrupted(k int) string {
	if s.ctx.Err() == nil {
		return ""
	}
	return fmt.Sprintf("interrupted before forward %d: %v", k, context.Cause(s.ctx))
}

// drained counts the requests a drain kept from starting, once the
// forwards are all scheduled.
func (s *stopper) drained() int {
	n := 0
	for _, st := range s.started {
		if !st {
			n++
		}
	}
	return n
}

// finishCtx is the context of a chunk's Finish: an interrupt does not cut
// the chunks already launched (each Finish is bounded by the engine's
// FinishTimeout), so the decode side is told how each really ended.
func (s *stopper) finishCtx() context.Context { return context.WithoutCancel(s.ctx) }

// syncCtx bounds the wait for the forward being run when an interrupt
// comes: it is waited for (its chunks are in the engine) for at most a
// minute.
func (s *stopper) syncCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(s.ctx), time.Minute)
}

// countDone sets the report's counts of what a run did, also one that
// stopped early: forwards launched and ended, chunks whose every Finish
// (one per prefill rank: perChunk) succeeded, requests all of whose
// chunks did.
func (m *ModeReport) countDone(p *plan, col *collector, forwards, perChunk int) {
	col.mu.Lock()
	defer col.mu.Unlock()
	m.ForwardsDone = forwards
	ok := map[int]int{}
	bad := map[int]bool{}
	for _, f := range col.finishes {
		if f.ok {
			ok[f.room]++
		} else {
			bad[f.room] = true
		}
	}
	m.ChunksDone, m.RequestsDone = 0, 0
	for room, n := range ok {
		m.ChunksDone += n / perChunk
		if !bad[room] && n == p.chunks[room]*perChunk {
			m.RequestsDone++
		}
	}
}

// moved sets the batch figures of a run that stopped early (summarize,
// which needs every request's forwards, is not run for it): its batches
// still crossed.
func (m *ModeReport) moved(col *collector, forwards int) {
	col.mu.Lock()
	defer col.mu.Unlock()
	m.countBatches(col.batches, forwards)
}

// countBatches sets the counts, bytes and rates of batches, posted over
// forwards forwards, and returns the window from the first post to the
// last completion.
func (m *ModeReport) countBatches(batches []system.Batch, forwards int) time.Duration {
	var first, last time.Time
	for _, b := range batches {
		m.Batches++
		m.Blocks += b.Blocks
		m.BytesMoved += b.Bytes
		if first.IsZero() || b.Posted.Before(first) {
			first = b.Posted
		}
		if b.Done.After(last) {
			last = b.Done
		}
	}
	window := last.Sub(first)
	if window > 0 {
		m.MovedGBytePerS = float64(m.BytesMoved) / window.Seconds() / 1e9
	}
	if forwards > 0 {
		m.SubmitsPerForward = float64(m.Batches) / float64(forwards)
		m.BlocksPerForward = float64(m.Blocks) / float64(forwards)
	}
	return window
}

// finished reports whether one Finish succeeded.
func finished(status system.Status, err error) bool {
	return err == nil && status == system.Succeeded
}
