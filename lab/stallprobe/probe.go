package stallprobe

import (
	"sync"
	"time"
)

// Probe records stalls: a goroutine sleeps Tick at a time, and each wake
// later than Slack past its due time records the lateness as a stall
// interval. A test asks how much of an interval the process spent stalled:
// a timeout while the process itself could not run is the machine's, not
// the code's.
type Probe struct {
	mu     sync.Mutex
	stalls []Interval // in time order
	last   time.Time  // the latest tick
	stop   chan struct{}
	done   chan struct{}
	ticked chan struct{} // closed at the probe's first tick: it measures from then on
}

// Interval is one stall, [From, To).
type Interval struct{ From, To time.Time }

const (
	// Tick is how often the probe's goroutine wakes.
	Tick = time.Millisecond
	// Slack is the timer and scheduler jitter of a process that runs: a
	// wake later than this is a stall.
	Slack     = 2 * time.Millisecond
	maxStalls = 1 << 16
)

// Start starts a probe; it returns once the probe measures.
func Start() *Probe {
	p := &Probe{stop: make(chan struct{}), done: make(chan struct{}), ticked: make(chan struct{})}
	go p.run()
	<-p.ticked
	return p
}

func (p *Probe) run() {
	defer close(p.done)
	t := time.NewTimer(Tick)
	defer t.Stop()
	due := time.Now().Add(Tick)
	first := true
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			now := time.Now()
			if first {
				first = false
				close(p.ticked)
			}
			p.mu.Lock()
			if late := now.Sub(due); late > Slack {
				if len(p.stalls) >= maxStalls {
					p.stalls = p.stalls[len(p.stalls)/2:] // keep the recent half
				}
				p.stalls = append(p.stalls, Interval{due, now})
			}
			p.last = now
			p.mu.Unlock()
			due = now.Add(Tick)
			t.Reset(Tick)
		}
	}
}

// Stalled is how much of [from, to] the process spent stalled. It first
// waits for the probe's first tick after to: a stall that ended just
// before to is recorded only when the probe runs again.
func (p *Probe) Stalled(from, to time.Time) time.Duration {
	for {
		p.mu.Lock()
		if p.last.After(to) {
			d := Overlap(p.stalls, from, to)
			p.mu.Unlock()
			return d
		}
		p.mu.Unlock()
		time.Sleep(Tick) // the probe ticks every Tick: a condition wait
	}
}

// Overlap is how much of [from, to] the stalls cover.
func Overlap(stalls []Interval, from, to time.Time) time.Duration {
	var d time.Duration
	for _, s := range stalls {
		a, b := s.From, s.To
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			d += b.Sub(a)
		}
	}
	return d
}

// Close stops the probe's goroutine.
func (p *Probe) Close() {
	close(p.stop)
	<-p.done
}
