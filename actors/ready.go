package actors

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"time"
)

// readyHub is the submitters' shared ready queue (the shell around
// ReadyQueue) and their event waits. The Works that wait on one event (every
// chunk's Work of a forward's group, every chunk's rest at the forward's
// end) share one wait, on one goroutine: the wait's end queues them all
// together, and each submitter, resumed, then posts the most urgent Work
// queued, not necessarily its own. Without the shared queue the Works of one
// event were posted in the order their wait goroutines happened to wake, and
// a request with chunks to come could take the link ahead of one whose time
// to first token was being paid; without the shared wait a forward of n
// chunks started n goroutines per group, on the critical path of its
// batches. A chunk that stops accepting work (its job's context) leaves the
// wait at once, queued alone with its context's error, and the wait ends
// when no Work is left on it. An event that is no map key gets a wait per
// Work.
type readyHub struct {
	mu      sync.Mutex
	q       ReadyQueue
	arrived uint64
	byID    map[uint64]*readyWork
	waits   map[any]*eventWait // by event: the wait in progress on it
	// jobs are the Works on shared waits, by job: a job that stops
	// accepting work (Job.onStop, told once) takes them off their waits.
	jobs map[*Job][]*readyWork
}

// eventWait is one wait on an event and the Works queued when it ends.
type eventWait struct {
	event  any // its key in readyHub.waits
	works  []*readyWork
	cancel context.CancelFunc // ends the wait once no Work is left on it
}

// readyWork is one Work between its arrival and its post.
type readyWork struct {
	w      *Work
	id     uint64
	ew     *eventWait // the shared wait it is on, until queued
	begin  time.Time
	wt     waited
	queued bool
	wake   func() // resumes the submitter that received it
}

func newReadyHub(fifo bool) *readyHub {
	return &readyHub{q: ReadyQueue{FIFO: fifo}, byID: map[uint64]*readyWork{}, waits: map[any]*eventWait{}, jobs: map[*Job][]*readyWork{}}
}

// add registers a Work whose wait begins now and waits its event: on the
// wait already under way on that event, or on one it starts. wake resumes
// its submitter once the Work is queued.
func (h *readyHub) add(w *Work, begin time.Time, wake func()) *readyWork {
	ev, job := w.Event, w.Job
	h.mu.Lock()
	h.arrived++
	rw := &readyWork{w: w, id: h.arrived, begin: begin, wake: wake}
	if ev == nil || !reflect.TypeOf(ev).Comparable() {
		h.mu.Unlock()
		go func() { h.ended(rw, ev.Wait(job.Context()), time.Now()) }()
		return rw
	}
	if _, watched := h.jobs[job]; !watched {
		// The job's hook is set without h.mu held: onStop takes the job's
		// gate, which a submitter holds across a post.
		h.mu.Unlock()
		hooked := job.onStop(func() { h.jobStopped(job) })
		h.mu.Lock()
		if !hooked || job.Context().Err() != nil {
			// The job stopped already (or in between: its hook found no
			// Work of it to take off): the Work waits for nothing.
			h.queue(rw, waited{start: begin, end: time.Now(), err: job.Context().Err()})
			h.mu.Unlock()
			rw.wake()
			return rw
		}
	}
	ew := h.waits[ev]
	if ew == nil {
		ctx, cancel := context.WithCancel(context.Background())
		ew = &eventWait{event: ev, cancel: cancel}
		h.waits[ev] = ew
		go func() { h.eventEnded(ev, ew, ev.Wait(ctx), time.Now()) }()
	}
	ew.works = append(ew.works, rw)
	rw.ew = ew
	h.jobs[job] = append(h.jobs[job], rw)
	h.mu.Unlock()
	return rw
}

// eventEnded queues every Work still on ew, whose wait on ev returned err
// at end: nil, or the event's failure, which is each Work's. A wait that
// ended because no Work was left on it queues nothing.
func (h *readyHub) eventEnded(ev any, ew *eventWait, err error, end time.Time) {
	h.mu.Lock()
	if h.waits[ev] == ew {
		delete(h.waits, ev)
	}
	batch := ew.works
	ew.works = nil
	for _, x := range batch {
		x.ew = nil
		h.unwatch(x)
		h.queue(x, waited{start: x.begin, end: end, err: err})
	}
	h.mu.Unlock()
	ew.cancel()
	for _, x := range batch {
		x.wake()
	}
}

// unwatch takes rw off its job's list. The caller holds h.mu. The job's
// hook stays: the job's next Work uses it.
func (h *readyHub) unwatch(rw *readyWork) {
	job := rw.w.Job
	list, ok := h.jobs[job]
	if !ok {
		return // the job stopped: jobStopped took its list, and the key must not come back
	}
	for i, x := range list {
		if x == rw {
			list = slices.Delete(list, i, i+1) // zeroes the freed slot
			break
		}
	}
	h.jobs[job] = list
}

// jobStopped takes every Work of job off its event's wait (cancelled).
func (h *readyHub) jobStopped(job *Job) {
	h.mu.Lock()
	works := h.jobs[job]
	delete(h.jobs, job)
	h.mu.Unlock()
	for _, rw := range works {
		h.cancelled(rw)
	}
}

// cancelled takes rw, whose job stopped accepting work, off its event's
// wait and queues it alone with its context's error; the wait ends if no
// Work is left on it.
func (h *readyHub) cancelled(rw *readyWork) {
	h.mu.Lock()
	ew := rw.ew
	if rw.queued || ew == nil {
		h.mu.Unlock()
		return
	}
	for i, x := range ew.works {
		if x == rw {
			ew.works = append(ew.works[:i], ew.works[i+1:]...)
			break
		}
	}
	rw.ew = nil
	last := len(ew.works) == 0
	if last && h.waits[ew.event] == ew {
		delete(h.waits, ew.event)
	}
	h.queue(rw, waited{start: rw.begin, end: time.Now(), err: rw.w.Job.Context().Err()})
	h.mu.Unlock()
	if last {
		ew.cancel()
	}
	rw.wake()
}

// ended queues rw, a Work with a wait of its own that returned err at end.
func (h *readyHub) ended(rw *readyWork, err error, end time.Time) {
	h.mu.Lock()
	h.queue(rw, waited{start: rw.begin, end: end, err: err})
	h.mu.Unlock()
	rw.wake()
}

// queue puts rw in the ready queue. The caller holds h.mu.
func (h *readyHub) queue(rw *readyWork, wt waited) {
	rw.queued, rw.wt = true, wt
	h.byID[rw.id] = rw
	h.q.Push(rw.id, UrgencyOf(rw.w, rw.id))
}

// takeUpTo appends to buf up to n queued Works, the most urgent first,
// and returns it.
func (h *readyHub) takeUpTo(buf []*readyWork, n int) []*readyWork {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(buf) < n {
		id, ok := h.q.Pop()
		if !ok {
			break
		}
		buf = append(buf, h.byID[id])
		delete(h.byID, id)
	}
	return buf
}

// requeue puts back Works taken and not served (their submitter is
// restarting), and wakes their submitters.
func (h *readyHub) requeue(rws []*readyWork) {
	h.mu.Lock()
	for _, rw := range rws {
		h.byID[rw.id] = rw
		h.q.Push(rw.id, UrgencyOf(rw.w, rw.id))
	}
	h.mu.Unlock()
	for _, rw := range rws {
		rw.wake()
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
