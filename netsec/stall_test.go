package netsec

import (
	"sync"
	"time"
)

// stallProbe measures how long this process could not run a goroutine when
// it wanted to (tests/starvation_test.go's probe, which the reliability
// suite uses): a goroutine sleeps probeTick at a time, and each wake later
// than probeSlack past its due time records the lateness as a stall. A
// monitor starved of CPU takes its ticks late and declares a loss that
// much later, by design (silentTooLong); a heartbeat test's bound allows
// for the stalls the probe measured, and for nothing else.
type stallProbe struct {
	mu     sync.Mutex
	stalls []stall
	last   time.Time // the latest tick
	stop   chan struct{}
	done   chan struct{}
}

type stall struct{ from, to time.Time }

const (
	probeTick  = time.Millisecond
	probeSlack = 2 * time.Millisecond // timer and scheduler jitter of a process that runs
	maxStalls  = 1 << 16
)

func startStallProbe() *stallProbe {
	p := &stallProbe{stop: make(chan struct{}), done: make(chan struct{}), last: time.Now()}
	go p.run()
	return p
}

func (p *stallProbe) run() {
	defer close(p.done)
	t := time.NewTimer(probeTick)
	defer t.Stop()
	due := time.Now().Add(probeTick)
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			now := time.Now()
			p.mu.Lock()
			if late := now.Sub(due); late > probeSlack && len(p.stalls) < maxStalls {
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
			var d time.Duration
			for _, s := range p.stalls {
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
			p.mu.Unlock()
			return d
		}
		p.mu.Unlock()
		time.Sleep(probeTick) // the probe ticks every probeTick: a condition wait
	}
}

func (p *stallProbe) close() {
	close(p.stop)
	<-p.done
}
