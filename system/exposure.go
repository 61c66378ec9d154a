package system

import (
	"sync"
	"time"

	"github.com/kvstream/kvstream/hw/cuda"
)

// keptEnds is how many forwards' end events the engine remembers for
// Finish. A chunk finishes within its finish timeout of its forward's end,
// and no deployment runs thousands of forwards in that time; a chunk
// finished later still gets the host-side reading.
const keptEnds = 4096

// forwardEnds remembers each recent forward's end-of-forward event, so that
// Finish can read when the device passed it.
type forwardEnds struct {
	mu sync.Mutex
	m  map[uint64]cuda.Event
}

func (f *forwardEnds) put(id uint64, ev cuda.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[uint64]cuda.Event{}
	}
	f.m[id] = ev
	// Forwards without chunks record no end, so ids have gaps: sweep
	// everything old at once, rarely enough to cost O(1) per forward.
	if len(f.m) > 2*keptEnds {
		for k := range f.m {
			if k+keptEnds <= id {
				delete(f.m, k)
			}
		}
	}
}

func (f *forwardEnds) get(id uint64) cuda.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[id]
}

// Phases split a chunk's exposed time, from the end of its forward on the
// device to Finish's return, at the chunk's last event wait that returned,
// its last post and its last landing. Each instant is clamped to the one
// before, so that the phases add up to the exposed time: a phase that was
// over before the forward ended counts zero.
type Phases struct {
	// Detect: forward ended on the device → the last event wait returned.
	Detect time.Duration
	// Post: → the last batch posted.
	Post time.Duration
	// Land: → the last batch landed (the transport reported completion).
	Land time.Duration
	// Finish: → Finish returned.
	Finish time.Duration
}

// exposure sets r's ForwardDone and Exposed at Finish's return ret, and
// returns the exposed time's phases (ok false when the chunk had no
// forward end).
//
// The forward's end is when the device passed its end-of-forward event:
// the event's device timestamp where the stream provides one, else when a
// submitter's wait on it returned (the chunk core's reading). A forward
// still running on the device when Finish returned hid the whole transfer:
// exposed 0. Starting at the host's End() call instead would count the
// time the GPU ran behind the host as exposed transfer.
func (e *Engine) exposure(r *Result, ret time.Time) (Phases, bool) {
	s := &r.Stats
	if s.ForwardEnd.IsZero() {
		return Phases{}, false
	}
	if ev := e.ends.get(s.Forward); ev != nil {
		if t, ok := ev.(cuda.Timed); ok {
			if at, ok := t.CompletedAt(); ok {
				s.ForwardDone = at.Round(0)
			} else {
				s.ForwardDone = time.Time{} // not passed yet
			}
		}
		if s.ForwardDone.IsZero() {
			if done, err := ev.Query(); err == nil && done {
				// Nothing waited on it (no rest to send) and the stream
				// gives no timestamp: the last wait that returned is the
				// latest instant known to precede it, so the exposed time
				// is an upper bound.
				s.ForwardDone = s.LastWait
			}
		}
	}
	if s.ForwardDone.IsZero() || !s.ForwardDone.Before(ret) {
		s.Exposed = 0
		return Phases{}, true
	}
	s.Exposed = ret.Sub(s.ForwardDone)
	t0 := s.ForwardDone
	t1 := later(t0, s.LastWait)
	t2 := later(t1, s.LastPost)
	t3 := later(t2, s.LastDone)
	t4 := later(t3, ret)
	return Phases{Detect: t1.Sub(t0), Post: t2.Sub(t1), Land: t3.Sub(t2), Finish: t4.Sub(t3)}, true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
