package cpu

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
)

// Kernel is device work: Run executes on the stream's goroutine, after every
// kernel launched before it and before every one launched after it.
type Kernel struct {
	Name string
	Run  func()
}

// Span is one executed kernel, as wall-clock instants.
type Span struct {
	Stream, Name string
	Start, End   time.Time
}

// Options configure a stream.
type Options struct {
	// OnSpan, if set, observes every kernel after it ran, on the stream's
	// goroutine: keep it short, it delays the next kernel.
	OnSpan func(Span)
}

type op struct {
	kernel Kernel
	event  *Event
}

// Stream executes kernels in launch order on its own goroutine.
type Stream struct {
	name string
	opts Options

	mu    sync.Mutex
	queue []op
	err   error // set once: closed, or lost to a kernel's panic
	seq   uint64

	wake    chan struct{}
	stopped chan struct{}
}

var _ cuda.Stream = (*Stream)(nil)

// NewStream starts a stream. Close it to stop its goroutine.
func NewStream(name string, opts Options) *Stream {
	s := &Stream{name: name, opts: opts, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go s.loop()
	return s
}

// Name returns the stream's name.
func (s *Stream) Name() string { return s.name }

// Launch enqueues a kernel; it returns at once.
func (s *Stream) Launch(k Kernel) error {
	if k.Run == nil {
		return errors.Newf("cpu: stream %s: kernel %q has no Run", s.name, k.Name)
	}
	return s.push(op{kernel: k})
}

// Record enqueues an event: it completes when the stream reached it, that
// is when every kernel launched before the call has run.
func (s *Stream) Record() (cuda.Event, error) {
	s.mu.Lock()
	s.seq++
	ev := &Event{done: make(chan struct{}), stream: s.name, seq: s.seq}
	s.mu.Unlock()
	if err := s.push(op{event: ev}); err != nil {
		return nil, err
	}
	return ev, nil
}

// Synchronize waits until everything launched so far has run; it returns
// the stream's error if it was lost or closed first.
func (s *Stream) Synchronize(ctx context.Context) error {
	ev, err := s.Record()
	if err != nil {
		return err
	}
	return ev.Wait(ctx)
}

// Err returns why the stream stopped (closed, or a kernel panicked), or nil
// while it runs.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close stops the stream. A kernel that is running completes (a Go function
// cannot be interrupted); work queued behind it is dropped and its events
// fail with an error marked cuda.ErrDeviceLost. Close returns once the
// stream's goroutine stopped.
func (s *Stream) Close() {
	s.fail(errors.Mark(errors.Newf("cpu: stream %s is closed", s.name), cuda.ErrDeviceLost))
	<-s.stopped
}

// fail stops the stream with err unless it already stopped.
func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.signal()
}

func (s *Stream) push(o op) error {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	s.queue = append(s.queue, o)
	s.mu.Unlock()
	s.signal()
	return nil
}

func (s *Stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Stream) loop() {
	defer close(s.stopped)
	var batch []op
	for {
		s.mu.Lock()
		batch, s.queue = s.queue, batch[:0]
		err := s.err
		s.mu.Unlock()
		if err != nil {
			s.failAll(batch, err)
			return
		}
		if len(batch) == 0 {
			<-s.wake
			continue
		}
		for i, o := range batch {
			if err := s.Err(); err != nil {
				// Closed while earlier work ran: what was not reached
				// fails with the rest of the queue.
				s.failAll(batch[i:], err)
				break
			}
			if o.event != nil {
				o.event.reach(time.Now())
				continue
			}
			if err := s.run(o.kernel); err != nil {
				s.fail(err)
				s.failAll(batch[i+1:], s.Err())
				break
			}
		}
		clear(batch) // drop the kernels' closures
	}
}

// run executes one kernel; a panic is returned as a device fault.
func (s *Stream) run(k Kernel) (err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			// The error's stack (errors.Newf records it here, on top of
			// the panicking frames) says where; %+v prints it.
			err = errors.Mark(errors.Newf("cpu: stream %s: kernel %q panicked: %v", s.name, k.Name, r), cuda.ErrDeviceLost)
		}
	}()
	k.Run()
	if f := s.opts.OnSpan; f != nil {
		f(Span{Stream: s.name, Name: k.Name, Start: start, End: time.Now()})
	}
	return nil
}

// failAll fails the events among ops and the queue's.
func (s *Stream) failAll(ops []op, err error) {
	for _, list := range [][]op{ops, s.drain()} {
		for _, o := range list {
			if o.event != nil {
				o.event.fail(errors.Wrapf(err, "event %d on stream %s", o.event.seq, s.name))
			}
		}
	}
}

func (s *Stream) drain() []op {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q
}

// Event is a point in a CPU stream's execution.
type Event struct {
	stream string
	seq    uint64
	done   chan struct{}
	once   sync.Once
	err    atomic.Pointer[error]
	at     time.Time // device timestamp; written before done closes
}

var (
	_ cuda.Event = (*Event)(nil)
	_ cuda.Timed = (*Event)(nil)
)

// Seq returns the event's sequence number on its stream (1-based).
func (e *Event) Seq() uint64 { return e.seq }

func (e *Event) String() string { return fmt.Sprintf("event %d on stream %s", e.seq, e.stream) }

func (e *Event) reach(at time.Time) {
	e.once.Do(func() {
		e.at = at
		close(e.done)
	})
}

func (e *Event) fail(err error) {
	e.once.Do(func() {
		e.err.Store(&err)
		close(e.done)
	})
}

// CompletedAt implements cuda.Timed: the instant the stream reached the
// event, right after the kernel before it returned (or, on an idle stream,
// right after the Record call).
func (e *Event) CompletedAt() (time.Time, bool) {
	select {
	case <-e.done:
		if e.err.Load() != nil {
			return time.Time{}, false
		}
		return e.at, true
	default:
		return time.Time{}, false
	}
}

// Query reports whether the stream reached the event.
func (e *Event) Query() (bool, error) {
	select {
	case <-e.done:
		if p := e.err.Load(); p != nil {
			return false, *p
		}
		return true, nil
	default:
		return false, nil
	}
}

// Wait blocks until the stream reached the event, the stream failed, or ctx
// ended.
func (e *Event) Wait(ctx context.Context) error {
	select {
	case <-e.done:
		if p := e.err.Load(); p != nil {
			return *p
		}
		return nil
	case <-ctx.Done():
		return errors.Wrapf(ctx.Err(), "cpu: wait for event %d on stream %s", e.seq, e.stream)
	}
}
