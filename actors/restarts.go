package actors

import (
	"sync"
	"time"
)

// RestartWindow counts restarts in a sliding window. The submitter pool
// never stops a submitter (work routed to a stopped one would be lost as
// dead letters); instead, more than Max restarts within Window is a restart
// storm, during which the engine reports itself unhealthy and refuses new
// registrations, until the rate falls back under the limit.
type RestartWindow struct {
	Max    int
	Window time.Duration

	mu    sync.Mutex
	times []time.Time
}

// Add records a restart at now and reports whether the window now holds
// more than Max restarts.
func (w *RestartWindow) Add(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.times = append(w.expire(now), now)
	return len(w.times) > w.Max
}

// Storm reports whether more than Max restarts happened within Window
// before now.
func (w *RestartWindow) Storm(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.times = w.expire(now)
	return len(w.times) > w.Max
}

func (w *RestartWindow) expire(now time.Time) []time.Time {
	i := 0
	for i < len(w.times) && now.Sub(w.times[i]) >= w.Window {
		i++
	}
	return append(w.times[:0], w.times[i:]...)
}
