package clock

import (
	"math"
	"runtime"
	"time"
)

// Slack is how long before the deadline SleepUntil stops trusting the
// timer and yields in a loop instead.
const Slack = 1500 * time.Microsecond

// SleepUntil returns at deadline (or at once if it passed). With precise
// set it sleeps until Slack before the deadline, then yields the processor
// until the deadline: accurate to a few microseconds, at the cost of up to
// Slack of busy CPU per call. Without, it is time.Sleep.
func SleepUntil(deadline time.Time, precise bool) {
	d := time.Until(deadline)
	if d <= 0 {
		return
	}
	if !precise {
		time.Sleep(d)
		return
	}
	if d > Slack {
		time.Sleep(d - Slack)
	}
	for time.Now().Before(deadline) {
		runtime.Gosched()
	}
}

// SleepUntilOr is SleepUntil that returns early, with false, once stop is
// closed: a modeled interval can be long (a slow --time-scale), and closing
// what sleeps must not wait for it.
func SleepUntilOr(deadline time.Time, precise bool, stop <-chan struct{}) bool {
	d := time.Until(deadline)
	if d <= 0 {
		return true
	}
	if precise && d <= Slack {
		SleepUntil(deadline, true)
		return true
	}
	wait := d
	if precise {
		wait = d - Slack
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
	}
	if precise {
		SleepUntil(deadline, true)
	}
	return true
}

// MaxDuration is the longest duration a model can stamp: time.Duration's
// range, about 292 years.
const MaxDuration = time.Duration(math.MaxInt64)

// Duration converts a modeled length in nanoseconds, as the models compute
// it (a float: bytes over a rate, a duration over a time scale), to a
// time.Duration, and says whether it fits. One that does not is
// MaxDuration, never the wrapped value Go's conversion gives (on amd64 the
// most negative duration, which stamps a batch or a kernel as done before
// it began). NaN does not fit either, and is 0.
func Duration(ns float64) (time.Duration, bool) {
	switch {
	case math.IsNaN(ns):
		return 0, false
	case ns >= 0x1p63: // float64(math.MaxInt64) rounds up to 2^63, which does not fit
		return MaxDuration, false
	case ns < -0x1p63:
		return -MaxDuration, false
	}
	return time.Duration(ns), true
}
