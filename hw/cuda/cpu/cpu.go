package cpu

import (
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/internal/standin"
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
	// q's error is set once: closed, or lost to a kernel's panic.
	q       *standin.Queue[op]
	stopped chan struct{}
}

var _ cuda.Stream = (*Stream)(nil)

// NewStream starts a stream. Close it to stop its goroutine.
func NewStream(name string, opts Options) *Stream {
	s := &Stream{name: name, opts: opts, q: standin.NewQueue[op](), stopped: make(chan struct{})}
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
	return s.q.Push(op{kernel: k})
}

// Record enqueues an event: it completes when the stream reached it, that
// is when every kernel launched before the call has run.
func (s *Stream) Record() (cuda.Event, error) {
	ev := &Event{}
	ev.Init("cpu", s.name, s.q.NextSeq())
	if err := s.q.Push(op{event: ev}); err != nil {
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
func (s *Stream) Err() error { return s.q.Err() }

// Close stops the stream. A kernel that is running completes (a Go function
// cannot be interrupted); work queued behind it is dropped and its events
// fail with an error marked cuda.ErrDeviceLost. Close returns once the
// stream's goroutine stopped.
func (s *Stream) Close() {
	s.q.Stop(errors.Mark(errors.Newf("cpu: stream %s is closed", s.name), cuda.ErrDeviceLost))
	<-s.stopped
}

func (s *Stream) loop() {
	defer close(s.stopped)
	var batch []op
	for {
		var err error
		batch, err = s.q.Take(batch)
		if err != nil {
			s.failAll(batch, err)
			return
		}
		if len(batch) == 0 {
			s.q.Wait()
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
				o.event.Reach(time.Now())
				continue
			}
			if err := s.run(o.kernel); err != nil {
				s.q.Stop(err)
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
	for _, list := range [][]op{ops, s.q.Drain()} {
		for _, o := range list {
			if o.event != nil {
				o.event.Fail(errors.Wrapf(err, "event %d on stream %s", o.event.Seq(), s.name))
			}
		}
	}
}

// Event is a point in a CPU stream's execution. Its device timestamp
// (CompletedAt, cuda.Timed) is the instant the stream reached it, right
// after the kernel before it returned (or, on an idle stream, right after
// the Record call).
type Event struct {
	standin.Event
}

var (
	_ cuda.Event = (*Event)(nil)
	_ cuda.Timed = (*Event)(nil)
)

func (e *Event) String() string { return fmt.Sprintf("event %d on stream %s", e.Seq(), e.Stream()) }
