package generate

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/tinylm"
)

// TestLinkGbpsBound: a rate at which the run's bytes would take longer on
// the link than a time.Duration holds is refused, naming --link-gbps, the
// value and the bound; the bound is exact on both sides, and at the least
// rate accepted the link's own arithmetic holds every byte of the run as
// one batch. 0.001 Gb/s is within it; 1e-15 Gb/s, which the range check
// (0, 1e6] let through, is not.
func TestLinkGbpsBound(t *testing.T) {
	for _, model := range []string{"tiny-gqa", "tiny-mla"} {
		t.Run(model, func(t *testing.T) {
			c := Defaults()
			c.Model = tinylm.Presets[model]
			c.DecodeTP = 2
			g, err := c.check()
			require.NoError(t, err)
			bound, bytes := c.minLinkGbps(&g)
			c.LinkGbps = bound
			_, err = c.check()
			require.Error(t, err)
			assert.Contains(t, err.Error(), fmt.Sprintf("--link-gbps %v: must be above %.6g Gb/s for this run", bound, bound))
			c.LinkGbps = math.Nextafter(bound, math.Inf(1))
			_, err = c.check()
			require.NoError(t, err)
			_, _, ok := loopback.Options{Bandwidth: c.LinkGbps * 1e9 / 8}.LinkTime(uint64(bytes))
			assert.True(t, ok, "the run's bytes fit the link's time at the least rate accepted")
			for gbps, ok := range map[float64]bool{0.001: true, 1e-15: false} {
				c.LinkGbps = gbps
				_, err = c.check()
				assert.Equal(t, ok, err == nil, "--link-gbps %v: %v", gbps, err)
			}
		})
	}
}
