package generate

import (
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/cuda/cpu"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The floor, by hand: tiny-gqa (6 hooked layers, 4 KV heads of 16 float32),
// one chunk of 32 tokens on one rank, K = 2, a 1 Gb/s link (125 bytes per
// µs) with 5 µs latency. A layer's K and V of 32 tokens are 2 x 32 x 4 x
// 16 x 4 = 16384 bytes, a group's 32768: 262.144 µs on the link.
func TestFloorByHand(t *testing.T) {
	cfg := Defaults()
	cfg.Model = tinylm.Presets["tiny-gqa"]
	cfg.PromptTokens, cfg.ChunkTokens, cfg.NewTokens, cfg.PageSize = 32, 32, 1, 16
	g, err := cfg.check()
	require.NoError(t, err)
	r, err := newRig(cfg, g, nil, nil)
	require.NoError(t, err)
	pl, err := reshard.NewPlan(&reshard.Pairing{Prefill: g.pre, Decode: g.dec}, reshard.Rank{})
	require.NoError(t, err)
	rk := &rank{routes: []*reshard.Route{&pl.Routes[0]}}
	t0 := time.Unix(1000, 0)
	at := func(us float64) time.Time { return t0.Add(time.Duration(us * float64(time.Microsecond))) }

	for _, tc := range []struct {
		name     string
		layerUs  float64 // every layer's kernel takes this long, back to back
		perLayer bool
		floorUs  float64
	}{
		// Groups ready at 2, 4, 6 ms: the link is idle for each; the last
		// lands 262.144 + 5 µs after the forward's end.
		{"per layer, idle link", 1000, true, 267.144},
		// One batch of 98304 bytes at 6 ms: 786.432 + 5 µs.
		{"monolithic", 1000, false, 791.432},
		// Groups ready at 200, 400, 600 µs queue: the link frees at
		// 462.144, 724.288, then 986.432 µs; + 5 µs latency - 600 µs.
		{"per layer, queued", 100, true, 391.432},
	} {
		col := &collector{spans: map[string]cpu.Span{}}
		for l := 0; l < 6; l++ {
			col.span(cpu.Span{Name: kernelName(0, 0, l), Start: at(float64(l) * tc.layerUs), End: at(float64(l+1) * tc.layerUs)})
		}
		fwdEnd := at(6 * tc.layerUs)
		mr := &modeRun{}
		require.NoError(t, r.timing(mr, col, []*rank{rk}, 0, fwdEnd.Add(2*time.Millisecond), tc.perLayer), tc.name)
		assert.InDelta(t, tc.floorUs, float64(mr.floor)/float64(time.Microsecond), 0.01, tc.name)
		assert.Equal(t, 2*time.Millisecond, mr.exposed, tc.name)
		assert.Equal(t, time.Duration(6*tc.layerUs*float64(time.Microsecond)), mr.forward, tc.name)
	}
}

func TestIdealLandingsByHand(t *testing.T) {
	t0 := time.Unix(0, 0)
	us := func(x float64) time.Time { return t0.Add(time.Duration(x * float64(time.Microsecond))) }
	// 1e6 bytes/s: a byte a µs. Batch 1 is ready later than batch 2 but
	// generated first: the link serves by readiness, ties in order.
	land := idealLandings([]linkBatch{
		{ready: us(100), bytes: 50, order: 0},
		{ready: us(0), bytes: 120, order: 1},
		{ready: us(100), bytes: 10, order: 2},
	}, 1e6, 3*time.Microsecond)
	assert.Equal(t, []time.Time{us(173), us(123), us(183)}, land)
}
