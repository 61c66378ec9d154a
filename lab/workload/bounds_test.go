package workload

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
)

// TestModeledTimeBounds: a run whose modeled durations cannot be held in a
// time.Duration is refused, naming the flag, the value and the bound; the
// bound is exact on both sides (the value at it is refused, the next one
// up, or down, accepted), it moves with --time-scale, and at the accepted
// value the link's and the virtual GPU's own arithmetic hold the run's
// longest times without overflow, while just past it the link's does
// overflow. 0.001 Gb/s is within the bound. kvstream sim --link-gbps 1e-15
// once reported 0.46 ms of transfer: the link's time had wrapped.
func TestModeledTimeBounds(t *testing.T) {
	valid := func(t *testing.T, c Config) (geometry, modeledSpan) {
		t.Helper()
		g, err := c.validate()
		require.NoError(t, err)
		return g, c.modeledSpan(g)
	}
	refused := func(t *testing.T, c Config, want string) {
		t.Helper()
		_, err := c.validate()
		require.Error(t, err)
		assert.Contains(t, err.Error(), want)
	}

	t.Run("link", func(t *testing.T) {
		for _, ts := range []float64{1, MinTimeScale, MaxTimeScale} {
			c := Defaults()
			c.TimeScale = ts
			g, s := valid(t, c)
			bound := c.minLinkGbps(s)
			c.LinkGbps = bound
			refused(t, c, fmt.Sprintf("--link-gbps %v: must be above %.6g Gb/s for this run", bound, bound))
			c.LinkGbps = math.Nextafter(bound, math.Inf(1))
			valid(t, c)
			// The link's own arithmetic: every byte of the run as one
			// batch fits, as modeled and as wall time.
			lo := loopback.Options{Bandwidth: c.LinkGbps * 1e9 / 8, ByteScale: g.byteScale, TimeScale: c.TimeScale}
			_, _, ok := lo.LinkTime(uint64(s.bytes / g.byteScale))
			assert.True(t, ok, "at --time-scale %v and the least rate accepted, the run's bytes fit the link's time", ts)
			for _, gbps := range []float64{1e-15, bound / 2} {
				c.LinkGbps = gbps
				refused(t, c, fmt.Sprintf("--link-gbps %v: must be above", gbps))
			}
		}
		c := Defaults()
		c.LinkGbps = 0.001
		valid(t, c)
		// A negligible compute leaves the link the whole range: just past
		// the bound, the link's own time for the run overflows.
		c.LayerUsPerKTok = 1e-9
		g, s := valid(t, c)
		bound := c.minLinkGbps(s)
		lo := loopback.Options{Bandwidth: bound * (1 - 1e-6) * 1e9 / 8, ByteScale: g.byteScale, TimeScale: 1}
		_, _, ok := lo.LinkTime(uint64(s.bytes / g.byteScale))
		assert.False(t, ok, "the bound is where the link's time stops fitting")
	})

	t.Run("compute", func(t *testing.T) {
		c := Defaults()
		c.Preset, c.Requests, c.PromptTokens, c.ChunkTokens, c.PageSize, c.Layers = Presets["small"], 1, MaxTokens, MaxTokens, MaxPageSize, MaxLayers
		c.TimeScale = MinTimeScale
		_, s := valid(t, c)
		bound := c.maxLayerUsPerKTok(s)
		require.Less(t, bound, MaxLayerUsPerKTok, "a run within every flag's own bound can still model too much compute")
		c.LayerUsPerKTok = bound
		refused(t, c, fmt.Sprintf("--layer-us-per-ktok %v: must be below %.6g for this run", bound, bound))
		c.LayerUsPerKTok = math.Nextafter(bound, 0)
		// Accepted as far as the compute goes: the link's bound takes
		// over, asking for more than any link when the compute leaves it
		// next to nothing.
		_, err := c.validate()
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "--layer-us-per-ktok")
		assert.Contains(t, err.Error(), "--link-gbps 400: must be above")
		// The virtual GPU's own arithmetic: the longest kernel (a layer
		// over the whole prompt) fits as wall time.
		_, ok := sim.Options{TimeScale: c.TimeScale}.WallTime(c.layerTime(c.PromptTokens))
		assert.True(t, ok)
	})

	t.Run("sharded", func(t *testing.T) {
		c := Defaults()
		c.Preset, c.PrefillTP, c.DecodeTP = Presets["llama70b"], 2, 4
		c.LinkGbps = 0.001
		valid(t, c)
		c.LinkGbps = 1e-15
		refused(t, c, "--link-gbps 1e-15: must be above")
	})
}

func TestBelowBound(t *testing.T) {
	assert.Empty(t, belowBound(1, 0.199, 0.199))
	assert.Empty(t, belowBound(1, 0.1985, 0.199)) // within the rounding slack
	assert.Contains(t, belowBound(2, 0.150, 0.199), "room 2: exposed 0.150 ms is below 0.199 ms")
}
