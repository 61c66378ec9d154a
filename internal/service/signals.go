package service

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Shutdown turns the process's stop signals into the two stages of a
// service's end: the first SIGTERM or SIGINT starts the drain (Draining,
// Context), a second one abandons it (Hard), so that an operator who
// presses Ctrl-C twice is never kept waiting for the drain's bound.
type Shutdown struct {
	sigs chan os.Signal

	mu     sync.Mutex
	reason string
	count  int

	soft, hard context.Context
	cancelSoft context.CancelCauseFunc
	cancelHard context.CancelFunc
	stop       chan struct{}
	stopOnce   sync.Once
	wg         sync.WaitGroup
}

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
	s.hard, s.cancelHard = context.WithCancel(context.Background())
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
	s.mu.Unlock()
	if n == 1 {
		s.cancelSoft(errors.New(reason))
	} else {
		s.cancelHard()
	}
}

// Draining is closed when the drain must start (the first signal).
func (s *Shutdown) Draining() <-chan struct{} { return s.soft.Done() }

// Context ends when the drain must start: the context of accepting work.
// Its cause (context.Cause) is the reason.
func (s *Shutdown) Context() context.Context { return s.soft }

// Hard ends at a second signal: the context of the work in flight and of
// the drain itself, which it cuts short.
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
		s.cancelHard()
	})
}
