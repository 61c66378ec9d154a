package tally

import (
	"context"
	"sync/atomic"
)

// Tally counts completions and keeps the first error among them. Done may
// run on any goroutine; one goroutine at a time may Wait.
type Tally struct {
	n       atomic.Int64
	err     atomic.Pointer[error]
	waiting atomic.Bool   // a Wait is about to block, or blocks
	wake    chan struct{} // holds at most one wake-up
}

// New returns a Tally that has counted nothing.
func New() *Tally {
	return &Tally{wake: make(chan struct{}, 1)}
}

// Done counts one completion; a non-nil err is kept if it is the first.
// It never blocks, so a transport may call it on its progress goroutine.
func (t *Tally) Done(err error) {
	if err != nil {
		t.keep(err)
	}
	t.n.Add(1)
	// After the add: a Wait that set waiting before this load sees the new
	// count when it checks again, or gets this wake-up.
	if t.waiting.Load() {
		select {
		case t.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// keep stores err if it is the first. Apart from Done so that Done's err
// does not move to the heap on every call, failed or not.
func (t *Tally) keep(err error) {
	t.err.CompareAndSwap(nil, &err)
}

// Count is the number of completions so far.
func (t *Tally) Count() int64 { return t.n.Load() }

// Err is the first error a completion reported, or nil.
func (t *Tally) Err() error {
	if p := t.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Wait blocks until Count reaches n, or ctx ends (it returns ctx's error).
// It parks at once rather than spinning: the completion it waits for often
// runs on a goroutine that the poster's own processor would have to run.
func (t *Tally) Wait(ctx context.Context, n int64) error {
	for t.n.Load() < n {
		t.waiting.Store(true)
		// Checked again after saying so: a Done between the first check
		// and the store saw no waiter and sent nothing.
		if t.n.Load() >= n {
			t.waiting.Store(false)
			return nil
		}
		select {
		case <-t.wake: // maybe a stale wake-up: the loop checks again
		case <-ctx.Done():
			t.waiting.Store(false)
			if t.n.Load() >= n {
				return nil
			}
			return ctx.Err()
		}
		t.waiting.Store(false)
	}
	return nil
}
