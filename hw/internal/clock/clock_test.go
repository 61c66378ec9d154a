package clock

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDurationHoldsWhatDoesNotFit: a modeled length up to time.Duration's
// range converts as it is; beyond it (and NaN) it is held at the range's
// end and said not to fit, where Go's conversion wrapped it (on amd64 to
// the most negative duration).
func TestDurationHoldsWhatDoesNotFit(t *testing.T) {
	for _, tc := range []struct {
		ns   float64
		want time.Duration
		ok   bool
	}{
		{0, 0, true},
		{1.5e9, 1500 * time.Millisecond, true},
		{math.Nextafter(0x1p63, 0), time.Duration(math.Nextafter(0x1p63, 0)), true}, // the largest float that fits
		{0x1p63, MaxDuration, false},
		{1e30, MaxDuration, false},
		{math.Inf(1), MaxDuration, false},
		{-1e30, -MaxDuration, false},
		{math.NaN(), 0, false},
	} {
		got, ok := Duration(tc.ns)
		require.Equal(t, tc.ok, ok, "%v", tc.ns)
		require.Equal(t, tc.want, got, "%v", tc.ns)
		require.GreaterOrEqual(t, got*time.Duration(math.Copysign(1, tc.ns)), time.Duration(0), "%v: never wrapped to the other sign", tc.ns)
	}
}
