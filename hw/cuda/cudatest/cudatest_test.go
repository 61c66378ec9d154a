package cudatest

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// flaw is one way a stream breaks the contract.
type flaw int

const (
	correct        flaw = iota
	eager               // events complete when recorded
	lifo                // queued kernels run last first
	closeCompletes      // Close completes the events it did not reach
	untimed             // events carry no device timestamp
)

// fake is a minimal stream with a planted flaw: one goroutine running a
// queue, as the real ones do.
type fake struct {
	flaw    flaw
	mu      sync.Mutex
	queue   []fakeOp
	closed  bool
	wake    chan struct{}
	stopped chan struct{}
}

type fakeOp struct {
	run func()
	ev  *fakeEvent
}

type fakeEvent struct {
	done chan struct{}
	once sync.Once
	err  error
	at   time.Time
}

type untimedEvent struct{ e *fakeEvent }

func (u untimedEvent) Query() (bool, error)           { return u.e.Query() }
func (u untimedEvent) Wait(ctx context.Context) error { return u.e.Wait(ctx) }

func (e *fakeEvent) finish(err error) {
	e.once.Do(func() { e.err, e.at = err, time.Now(); close(e.done) })
}

func (e *fakeEvent) Query() (bool, error) {
	select {
	case <-e.done:
		return e.err == nil, e.err
	default:
		return false, nil
	}
}

func (e *fakeEvent) Wait(ctx context.Context) error {
	select {
	case <-e.done:
		return e.err
	case <-ctx.Done():
		return errors.Wrap(ctx.Err(), "wait")
	}
}

func (e *fakeEvent) CompletedAt() (time.Time, bool) {
	select {
	case <-e.done:
		return e.at, e.err == nil
	default:
		return time.Time{}, false
	}
}

func newFake(f flaw) *fake {
	s := &fake{flaw: f, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go s.loop()
	return s
}

var errLost = errors.Mark(errors.New("fake: closed"), cuda.ErrDeviceLost)

func (s *fake) push(o fakeOp) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errLost
	}
	s.queue = append(s.queue, o)
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

func (s *fake) Launch(run func()) error { return s.push(fakeOp{run: run}) }

func (s *fake) Record() (cuda.Event, error) {
	ev := &fakeEvent{done: make(chan struct{})}
	if s.flaw == eager {
		ev.finish(nil)
	}
	if err := s.push(fakeOp{ev: ev}); err != nil {
		return nil, err
	}
	if s.flaw == untimed {
		return untimedEvent{ev}, nil
	}
	return ev, nil
}

func (s *fake) loop() {
	defer close(s.stopped)
	for {
		s.mu.Lock()
		q, closed := s.queue, s.closed
		s.queue = nil
		s.mu.Unlock()
		if closed {
			for _, o := range q {
				switch {
				case s.flaw == closeCompletes:
					s.do(o) // runs the dropped kernels and completes the events
				case o.ev != nil:
					o.ev.finish(errLost)
				}
			}
			return
		}
		held := s.flaw == lifo && !slices.ContainsFunc(q, func(o fakeOp) bool { return o.ev != nil })
		if len(q) == 0 || held {
			// lifo holds kernels until an event is recorded, so that the
			// reversal does not depend on how the loop happened to batch.
			s.mu.Lock()
			s.queue = append(q, s.queue...)
			s.mu.Unlock()
			<-s.wake
			continue
		}
		if s.flaw == lifo {
			// The kernels between two events run last first; events keep
			// their place, so that what waits on them still sees every
			// kernel ahead run (the flaw is the order, not visibility).
			lo := 0
			for hi := 0; hi <= len(q); hi++ {
				if hi < len(q) && q[hi].ev == nil {
					continue
				}
				slices.Reverse(q[lo:hi])
				lo = hi + 1
			}
		}
		for i, o := range q {
			s.mu.Lock()
			closed := s.closed
			if closed {
				s.queue = append(q[i:], s.queue...) // dropped at the top of the loop
			}
			s.mu.Unlock()
			if closed {
				break
			}
			s.do(o)
		}
	}
}

func (s *fake) do(o fakeOp) {
	if o.ev != nil {
		o.ev.finish(nil)
		return
	}
	o.run()
}

func (s *fake) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-s.stopped
}

// The correct fake passes the suite: the suite asks nothing a simple
// in-order stream cannot give.
func TestCorrectFakePasses(t *testing.T) {
	Run(t, Factory{New: func(T) Stream { return newFake(correct) }})
}

// recorder is a T that notes failures instead of failing the test; FailNow
// ends the check's goroutine as testing.T's does.
type recorder struct {
	mu       sync.Mutex
	failures []string
	cleanups []func()
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}
func (r *recorder) FailNow()         { r.Errorf("FailNow"); runtime.Goexit() }
func (r *recorder) Helper()          {}
func (r *recorder) Cleanup(f func()) { r.mu.Lock(); r.cleanups = append(r.cleanups, f); r.mu.Unlock() }
func (r *recorder) failed() []string { r.mu.Lock(); defer r.mu.Unlock(); return r.failures }
func (r *recorder) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// TestSuiteCatchesBrokenStreams plants each flaw and requires the check
// meant for it to fail.
func TestSuiteCatchesBrokenStreams(t *testing.T) {
	for _, tc := range []struct {
		flaw  flaw
		check string
	}{
		{eager, "EventWaitsForEarlierKernels"},
		{lifo, "KernelsRunInOrderOneAtATime"},
		{closeCompletes, "CloseFailsWhatItDidNotReach"},
		{untimed, "DeviceTimestamps"},
	} {
		var run func(T, Factory)
		for _, c := range checks {
			if c.name == tc.check {
				run = c.run
			}
		}
		r := &recorder{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			run(r, Factory{New: func(T) Stream { return newFake(tc.flaw) }})
		}()
		<-done
		r.runCleanups()
		assert.NotEmpty(t, r.failed(), "%s passed on a stream with flaw %d", tc.check, tc.flaw)
	}
}
