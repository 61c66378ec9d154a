package hostprobe

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock advances by step per read, and by a planted gap at chosen reads.
type fakeClock struct {
	t     time.Time
	step  time.Duration
	gaps  map[int]time.Duration
	reads int
}

func (c *fakeClock) now() time.Time {
	c.reads++
	c.t = c.t.Add(c.step + c.gaps[c.reads])
	return c.t
}

func TestScanGapsCountsPlantedGaps(t *testing.T) {
	// 100 ns per read over 1 ms, with four gaps planted: 20 µs, 30 µs, one of
	// 6 µs just over the 5 µs threshold, and one of 4 µs under it that must
	// not count.
	c := &fakeClock{t: time.Unix(0, 0), step: 100 * time.Nanosecond,
		gaps: map[int]time.Duration{10: 20 * time.Microsecond, 500: 30 * time.Microsecond, 700: 6 * time.Microsecond, 900: 4 * time.Microsecond}}
	s := scanGaps(c.now, time.Millisecond, 5*time.Microsecond)
	require.Equal(t, 3, s.Count)
	require.InDelta(t, 30.1, s.MaxUs, 1e-9)    // the gap plus its read
	require.InDelta(t, 56.3/3, s.MeanUs, 1e-9) // (20.1 + 30.1 + 6.1) / 3
	require.InDelta(t, 100, s.ReadNs, 1)       // the 4 µs gap below the threshold adds under 1 ns per read
	require.InDelta(t, 5.0, s.ThresholdUs, 0)  // reported as given
	// The run ends at the first read at or past 1 ms: the fraction is the
	// gaps over that.
	require.InDelta(t, 56.3e-3/s.DurationMs, s.Fraction, 1e-9)
	require.InDelta(t, float64(s.Count)/(s.DurationMs/1e3), s.PerSecond, 1e-9)
}

func TestScanGapsWithoutGaps(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0), step: time.Microsecond}
	s := scanGaps(c.now, 100*time.Microsecond, 5*time.Microsecond)
	require.Zero(t, s.Count)
	require.Zero(t, s.Fraction)
	require.Zero(t, s.MeanUs)
	require.InDelta(t, 1000, s.ReadNs, 1e-9)
	require.InDelta(t, 0.1, s.DurationMs, 1e-9)
}

func TestDist(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100 … 1, unsorted
	}
	d := dist(xs)
	require.Equal(t, Dist{P50: 50, P90: 90, P99: 99, Max: 100}, d)
	require.Equal(t, Dist{P50: 7, P90: 7, P99: 7, Max: 7}, dist([]float64{7}))
	// Seven samples: the p50 is the 4th, the p90 the 7th (nearest rank:
	// ceil(0.9 * 7) = 7), as the sim's report takes them.
	require.Equal(t, Dist{P50: 4, P90: 7, P99: 7, Max: 7}, dist([]float64{7, 6, 5, 4, 3, 2, 1}))
	require.Equal(t, Dist{}, dist(nil))
}

func TestMeasureRejectsBadInput(t *testing.T) {
	_, err := MeasureStalls(0, time.Microsecond)
	require.ErrorContains(t, err, "stall run of 0s")
	_, err = MeasureStalls(time.Millisecond, -time.Microsecond)
	require.ErrorContains(t, err, "stall threshold -1µs")
	_, err = MeasureWake(0, time.Millisecond)
	require.ErrorContains(t, err, "0 wake-ups")
	_, err = MeasureWake(MaxWakes+1, time.Millisecond)
	require.ErrorContains(t, err, "1000001 wake-ups: must be 1 to 1000000")
	_, err = MeasureWake(3, 0)
	require.ErrorContains(t, err, "idle time 0s")
}

// The real probes run briefly: what they measure is the machine's, so only
// their bookkeeping is checked (every hand-off timed, percentiles ordered).
func TestMeasureRuns(t *testing.T) {
	s, err := MeasureStalls(20*time.Millisecond, 5*time.Microsecond)
	require.NoError(t, err)
	require.GreaterOrEqual(t, s.DurationMs, 20.0)
	require.Positive(t, s.ReadNs)
	require.LessOrEqual(t, s.Fraction, 1.0)

	w, err := MeasureWake(50, 50*time.Microsecond)
	require.NoError(t, err)
	require.Equal(t, 50, w.N)
	for _, d := range []Dist{w.SendUs, w.LatencyUs} {
		require.LessOrEqual(t, d.P50, d.P90)
		require.LessOrEqual(t, d.P90, d.P99)
		require.LessOrEqual(t, d.P99, d.Max)
		require.Positive(t, d.Max)
	}
}
