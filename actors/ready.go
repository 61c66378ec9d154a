package actors

import (
	"reflect"
	"sync"
	"time"
)

// readyHub is the submitters' shared ready queue (the shell around
// ReadyQueue). Each Work still waits its event on its own goroutine, so
// that a cancelled chunk's wait ends at once; but the first wait on an
// event to return queues every Work waiting on that event together, and
// each submitter, resumed, then posts the most urgent Work queued, not
// necessarily its own. Without it the Works of one event were posted in
// the order their wait goroutines happened to wake, and a request with
// chunks to come could take the link ahead of one whose time to first
// token was being paid.
type readyHub struct {
	mu      sync.Mutex
	q       ReadyQueue
	arrived uint64
	byID    map[uint64]*readyWork
	waiting map[any][]*readyWork // by event: Works whose wait has not ended
}

// readyWork is one Work between its arrival and its post.
type readyWork struct {
	w      *Work
	id     uint64
	key    any // its event, when usable as a map key
	begin  time.Time
	wt     waited
	queued bool
	wake   func() // resumes the submitter that received it
}

func newReadyHub(fifo bool) *readyHub {
	return &readyHub{q: ReadyQueue{FIFO: fifo}, byID: map[uint64]*readyWork{}, waiting: map[any][]*readyWork{}}
}

// add registers a Work whose wait begins now; wake resumes its submitter.
func (h *readyHub) add(w *Work, begin time.Time, wake func()) *readyWork {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.arrived++
	rw := &readyWork{w: w, id: h.arrived, begin: begin, wake: wake}
	if w.Event != nil && reflect.TypeOf(w.Event).Comparable() {
		rw.key = w.Event
		h.waiting[rw.key] = append(h.waiting[rw.key], rw)
	}
	return rw
}

// ended is told that rw's own wait returned with err at end. A completed
// event queues every Work still waiting on it, a failed or cancelled wait
// only rw; each queued Work's submitter is woken, after the queue holds
// them all.
func (h *readyHub) ended(rw *readyWork, err error, end time.Time) {
	h.mu.Lock()
	if rw.queued { // another wait on the same event queued it
		h.mu.Unlock()
		return
	}
	batch := []*readyWork{rw}
	if err == nil && rw.key != nil {
		batch = h.waiting[rw.key]
		delete(h.waiting, rw.key)
	} else if rw.key != nil {
		h.forget(rw)
	}
	for _, x := range batch {
		x.queued = true
		x.wt = waited{start: x.begin, end: end}
		if x == rw {
			x.wt.err = err
		}
		h.byID[x.id] = x
		h.q.Push(x.id, UrgencyOf(x.w, x.id))
	}
	h.mu.Unlock()
	for _, x := range batch {
		x.wake()
	}
}

// forget takes rw off its event's waiting list. The caller holds h.mu.
func (h *readyHub) forget(rw *readyWork) {
	list := h.waiting[rw.key]
	for i, x := range list {
		if x == rw {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(h.waiting, rw.key)
	} else {
		h.waiting[rw.key] = list
	}
}

// take returns the most urgent queued Work, or nil when none is queued
// (every wake has its Work in the queue, so a resumed submitter finds one).
func (h *readyHub) take() *readyWork {
	h.mu.Lock()
	defer h.mu.Unlock()
	id, ok := h.q.Pop()
	if !ok {
		return nil
	}
	rw := h.byID[id]
	delete(h.byID, id)
	return rw
}
