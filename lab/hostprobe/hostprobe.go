package hostprobe

import (
	"math"
	"runtime"
	"sort"
	"time"

	"github.com/cockroachdb/errors"
)

// Stalls is what a busy thread lost to the machine over a run: every gap
// longer than Threshold between two consecutive clock reads in a tight
// loop, a loop that otherwise reads the clock every ReadNs nanoseconds.
type Stalls struct {
	DurationMs  float64 `json:"duration_ms"`
	ThresholdUs float64 `json:"threshold_us"`
	// ReadNs is the loop's mean iteration (one clock read) outside gaps.
	ReadNs float64 `json:"clock_read_ns"`
	// Count gaps; PerSecond of them; MeanUs and MaxUs long; Fraction of
	// the run spent in them.
	Count     int     `json:"count"`
	PerSecond float64 `json:"per_second"`
	MeanUs    float64 `json:"mean_us"`
	MaxUs     float64 `json:"max_us"`
	Fraction  float64 `json:"fraction"`
}

// MeasureStalls spins on one OS thread for d and counts its gaps longer
// than threshold.
func MeasureStalls(d, threshold time.Duration) (Stalls, error) {
	if d <= 0 {
		return Stalls{}, errors.Newf("hostprobe: stall run of %v: must be positive", d)
	}
	if threshold <= 0 {
		return Stalls{}, errors.Newf("hostprobe: stall threshold %v: must be positive", threshold)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return scanGaps(time.Now, d, threshold), nil
}

// scanGaps is MeasureStalls' loop over a clock, so that a test can plant
// gaps in it.
func scanGaps(now func() time.Time, d, threshold time.Duration) Stalls {
	start := now()
	end := start.Add(d)
	prev := start
	var (
		count      int
		reads      int
		stalled    time.Duration
		longest    time.Duration
		outsideGap time.Duration
	)
	for prev.Before(end) {
		t := now()
		g := t.Sub(prev)
		reads++
		if g > threshold {
			count++
			stalled += g
			longest = max(longest, g)
		} else {
			outsideGap += g
		}
		prev = t
	}
	total := prev.Sub(start)
	s := Stalls{DurationMs: ms(total), ThresholdUs: us(threshold), Count: count, MaxUs: us(longest)}
	if n := reads - count; n > 0 {
		s.ReadNs = float64(outsideGap.Nanoseconds()) / float64(n)
	}
	if total > 0 {
		s.PerSecond = float64(count) / total.Seconds()
		s.Fraction = float64(stalled) / float64(total)
	}
	if count > 0 {
		s.MeanUs = us(stalled) / float64(count)
	}
	return s
}

// Wake is the cost of handing work to a goroutine parked on a channel
// while the other CPUs have been idle for Idle: SendUs is how long the
// sender's channel send took (the wake-up of an idle CPU is paid there),
// LatencyUs how long until the receiver ran.
type Wake struct {
	N         int     `json:"n"`
	IdleUs    float64 `json:"idle_us"`
	SendUs    Dist    `json:"send_us"`
	LatencyUs Dist    `json:"latency_us"`
}

// Dist is a distribution's percentiles, in the unit its field names.
type Dist struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// MaxWakes bounds MeasureWake's hand-offs, which size its sample buffers.
const MaxWakes = 1_000_000

// MeasureWake times n hand-offs, each after the sender slept for idle (so
// that the receiver's CPU went idle, as an engine's does between a
// forward's layers).
func MeasureWake(n int, idle time.Duration) (Wake, error) {
	if n <= 0 || n > MaxWakes {
		return Wake{}, errors.Newf("hostprobe: %d wake-ups: must be 1 to %d", n, MaxWakes)
	}
	if idle <= 0 {
		return Wake{}, errors.Newf("hostprobe: idle time %v: must be positive", idle)
	}
	c := make(chan time.Time)
	lat := make([]float64, 0, n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sent := range c {
			lat = append(lat, us(time.Since(sent)))
		}
	}()
	send := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		time.Sleep(idle)
		t := time.Now()
		c <- t
		send = append(send, us(time.Since(t)))
	}
	close(c)
	<-done
	return Wake{N: n, IdleUs: us(idle), SendUs: dist(send), LatencyUs: dist(lat)}, nil
}

// dist returns xs' percentiles (nearest rank, as the sim's report takes
// them); xs is sorted in place.
func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	sort.Float64s(xs)
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(xs)))) - 1
		return xs[min(max(i, 0), len(xs)-1)]
	}
	return Dist{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: xs[len(xs)-1]}
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
