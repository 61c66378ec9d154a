package service

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/cockroachdb/errors"
)

// Shutdown turns the process's stop signals into the two stages of a
// service's end: the first SIGTERM or SIGINT starts the drain (Draining,
// Context), a second one abandons it (Hard), so that an operator who
// presses Ctrl-C twice is never kept waiting for the drain's bound. That
// holds only if every wait of the command honours Hard (or a context
// derived from it): a connect, a retry's backoff, an injected fault's
// pause.
type Shutdown struct {
	sigs chan os.Signal

	mu     sync.Mutex
	reason string
	count  int

	soft, hard context.Context
	cancelSoft context.CancelCauseFunc
	cancelHard context.CancelCauseFunc
	stop       chan struct{}
	stopOnce   sync.Once
	wg         sync.WaitGroup
}

// cut ends at the first second stop of any Shutdown of this process; see
// Cut.
var cut, cutWith = context.WithCancelCause(context.Background())

// Cut ends when a command of this process is cut (the second stop of a
// Shutdown: signals are the process's), with the same cause as Hard, and
// never otherwise. It bounds the steps of a command's way out that run
// after its Shutdown was stopped, which Hard no longer tells apart from a
// cut: closing connections, whose waits (a stop that protoactor bounds at
// 10 s) would otherwise hold a process that was told to stop at once.
func Cut() context.Context { return cut }

// OnSignals starts listening for SIGTERM and SIGINT. Call Stop when the
// command ends.
func OnSignals() *Shutdown {
	s := newShutdown()
	signal.Notify(s.sigs, syscall.SIGTERM, os.Interrupt)
	return s
}

func newShutdown() *Shutdown {
	s := &Shutdown{sigs: make(chan os.Signal, 2), stop: make(chan struct{})}
	s.soft, s.cancelSoft = context.WithCancelCause(context.Background())
	s.hard, s.cancelHard = context.WithCancelCause(context.Background())
	s.wg.Go(func() {
		for {
			select {
			case sig := <-s.sigs:
				s.Trigger(sig.String())
			case <-s.stop:
				return
			}
		}
	})
	return s
}

// Trigger acts as a signal named reason would: the first call starts the
// drain, the second abandons it. A command calls it for its other ends (a
// supervisor closed its stdin).
func (s *Shutdown) Trigger(reason string) {
	s.mu.Lock()
	s.count++
	n := s.count
	if n == 1 {
		s.reason = reason
	}
	first := s.reason
	s.mu.Unlock()
	if n == 1 {
		s.cancelSoft(errors.New(reason))
	} else {
		cause := errors.Newf("cut by a second stop (%s, after %s)", reason, first)
		s.cancelHard(cause)
		cutWith(cause)
	}
}

// Draining is closed when the drain must start (the first signal).
func (s *Shutdown) Draining() <-chan struct{} { return s.soft.Done() }

// Context ends when the drain must start: the context of accepting work.
// Its cause (context.Cause) is the reason.
func (s *Shutdown) Context() context.Context { return s.soft }

// Hard ends at a second signal: the context of the work in flight and of
// the drain itself, which it cuts short. Its cause (context.Cause) says
// so and names both stops: "cut by a second stop (interrupt, after
// terminated)".
func (s *Shutdown) Hard() context.Context { return s.hard }

// Reason is what started the drain ("terminated", "interrupt", or what
// Trigger was given), "" before.
func (s *Shutdown) Reason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reason
}

// Stop stops listening for signals and releases the contexts.
func (s *Shutdown) Stop() {
	s.stopOnce.Do(func() {
		signal.Stop(s.sigs)
		close(s.stop)
		s.wg.Wait()
		s.cancelSoft(errors.New("stopped"))
		s.cancelHard(errors.New("stopped"))
	})
}
