package tests

import (
	"sync"
	"time"
)

// stallProbe measures how long this process could not run a goroutine
// when it wanted to: the evidence that tells CPU starvation (a loaded
// machine, other builds, a CPU hog) from a fault. A goroutine sleeps
// probeTick at a time; each wake later than probeSlack past its due time
// records the lateness as a stall interval. A test's oracle asks how much
// of an interval the process spent stalled: a timeout while the process
// itself could not run is the machine's, not the engine's.
type stallProbe struct {
	mu     sync.Mutex
	stalls []stall   // in time order
	last   time.Time // the latest tick
	stop   chan struct{}
	done   chan struct{}
	ticked chan struct{} // closed at the probe's first tick: it measures from then on
}

type stall struct{ from, to time.Time }

const (
	probeTick  = time.Millisecond
	probeSlack = 2 * time.Millisecond // timer and scheduler jitter of a process that runs
	maxStalls  = 1 << 16
)

func startStallProbe() *stallProbe {
	p := &stallProbe{stop: make(chan struct{}), done: make(chan struct{}), ticked: make(chan struct{})}
	go p.run()
	<-p.ticked
	return p
}

func (p *stallProbe) run() {
	defer close(p.done)
	t := time.NewTimer(probeTick)
	defer t.Stop()
	due := time.Now().Add(probeTick)
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
			if late := now.Sub(due); late > probeSlack {
				if len(p.stalls) >= maxStalls {
					p.stalls = p.stalls[len(p.stalls)/2:] // keep the recent half
				}
				p.stalls = append(p.stalls, stall{due, now})
			}
			p.last = now
			p.mu.Unlock()
			due = now.Add(probeTick)
			t.Reset(probeTick)
		}
	}
}

// stalled is how much of [from, to] the process spent stalled. It first
// waits for the probe's first tick after to: a stall that ended just
// before to is recorded only when the probe runs again.
func (p *stallProbe) stalled(from, to time.Time) time.Duration {
	for {
		p.mu.Lock()
		if p.last.After(to) {
			d := stallOverlap(p.stalls, from, to)
			p.mu.Unlock()
			return d
		}
		p.mu.Unlock()
		time.Sleep(probeTick) // the probe ticks every probeTick: a condition wait
	}
}

func stallOverlap(stalls []stall, from, to time.Time) time.Duration {
	var d time.Duration
	for _, s := range stalls {
		a, b := s.from, s.to
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

func (p *stallProbe) close() {
	close(p.stop)
	<-p.done
}
