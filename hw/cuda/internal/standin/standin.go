package standin

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
)

// Queue is a stream's work in launch order, taken by the stream's
// goroutine a batch at a time. Once stopped it takes no more work: Push
// returns the error it was stopped with, and Take hands what is left to
// the goroutine to fail.
type Queue[T any] struct {
	mu    sync.Mutex
	items []T
	err   error // set once: why the stream stopped
	seq   uint64
	wake  chan struct{}
}

// NewQueue returns an empty, running queue.
func NewQueue[T any]() *Queue[T] { return &Queue[T]{wake: make(chan struct{}, 1)} }

// NextSeq numbers a stream's next event: 1 for its first.
func (q *Queue[T]) NextSeq() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	return q.seq
}

// Push appends v and wakes the goroutine, unless the queue was stopped:
// then it returns the error it was stopped with.
func (q *Queue[T]) Push(v T) error {
	q.mu.Lock()
	if q.err != nil {
		err := q.err
		q.mu.Unlock()
		return err
	}
	q.items = append(q.items, v)
	q.mu.Unlock()
	q.signal()
	return nil
}

// PushFront puts items back ahead of the queue, in their order: work the
// goroutine took but did not reach.
func (q *Queue[T]) PushFront(items []T) {
	q.mu.Lock()
	q.items = append(append([]T(nil), items...), q.items...)
	q.mu.Unlock()
}

// Stop stops the queue with err unless it was stopped already, wakes the
// goroutine, and reports whether this call stopped it.
func (q *Queue[T]) Stop(err error) bool {
	q.mu.Lock()
	first := q.err == nil
	if first {
		q.err = err
	}
	q.mu.Unlock()
	q.signal()
	return first
}

// Err is why the queue stopped, or nil while it runs.
func (q *Queue[T]) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Take hands the goroutine everything queued, in buf's storage (the
// previous batch, whose elements it no longer needs), and the error the
// queue was stopped with, if it was.
func (q *Queue[T]) Take(buf []T) ([]T, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	batch := q.items
	q.items = buf[:0]
	return batch, q.err
}

// Drain removes and returns what is queued.
func (q *Queue[T]) Drain() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}

// Wait blocks until something was pushed or the queue stopped since the
// last Wait.
func (q *Queue[T]) Wait() { <-q.wake }

func (q *Queue[T]) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Event is a point in a stand-in stream's execution: it completes once,
// stamped with the instant the stream passed it, or fails with the
// stream.
type Event struct {
	name   string // the stand-in's, for errors: "cpu", "sim"
	stream string
	seq    uint64
	done   chan struct{}
	once   sync.Once
	err    atomic.Pointer[error]
	at     time.Time // device timestamp; written before done closes
}

// Init makes a zero Event, which a stand-in's own event embeds, event seq
// of the stream, not yet reached; name is the stand-in's, which its errors
// start with.
func (e *Event) Init(name, stream string, seq uint64) {
	e.name, e.stream, e.seq, e.done = name, stream, seq, make(chan struct{})
}

// Seq returns the event's sequence number on its stream (1-based).
func (e *Event) Seq() uint64 { return e.seq }

// Stream is the name of the event's stream.
func (e *Event) Stream() string { return e.stream }

// Reach completes the event at the device instant at, unless it already
// completed or failed.
func (e *Event) Reach(at time.Time) {
	e.once.Do(func() {
		e.at = at
		close(e.done)
	})
}

// Fail fails the event with err, unless it already completed or failed.
func (e *Event) Fail(err error) {
	e.once.Do(func() {
		e.err.Store(&err)
		close(e.done)
	})
}

// CompletedAt implements cuda.Timed: the instant the stream passed the
// event, and false while it has not (or failed).
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

// Query reports whether the stream passed the event.
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

// Wait blocks until the stream passed the event, the event failed, or ctx
// ended.
func (e *Event) Wait(ctx context.Context) error {
	select {
	case <-e.done:
		if p := e.err.Load(); p != nil {
			return *p
		}
		return nil
	case <-ctx.Done():
		return errors.Wrapf(ctx.Err(), "%s: wait for event %d on stream %s", e.name, e.seq, e.stream)
	}
}
