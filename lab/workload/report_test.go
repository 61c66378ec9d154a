package workload

import (
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDistNamesItsTail(t *testing.T) {
	xs := make([]float64, 99)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	d := dist(xs)
	assert.Nil(t, d.P99, "99 samples have no 99th percentile")
	name, v := d.Tail()
	assert.Equal(t, "max", name)
	assert.Equal(t, 99.0, v)
	d = dist(append(xs, 100))
	require.NotNil(t, d.P99)
	name, v = d.Tail()
	assert.Equal(t, "p99", name)
	assert.Equal(t, 99.0, v)
	assert.Equal(t, 100, d.N)
	assert.Equal(t, "1.0 (max of 1)", tailCell(dist([]float64{1}), "%.1f"))
	assert.Equal(t, "1.0 (n=1)", p50Cell(dist([]float64{1}), "%.1f"))
}

// summarize on a run made up by hand: one forward of two 64-page requests
// (dsv3, 8192 tokens: 4.096 ms per layer), every figure computed by hand.
func TestSummarizeByHand(t *testing.T) {
	cfg := Defaults()
	cfg.Requests, cfg.PromptTokens = 2, 4096
	g, err := cfg.validate()
	require.NoError(t, err)
	p, err := newPlan(cfg, g)
	require.NoError(t, err)
	require.Len(t, p.forwards, 1)

	ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	t0 := time.Unix(1000, 0)
	col := &collector{kernels: map[string]sim.Span{}}
	layer := ms(4.096)
	for l := 0; l < g.layers; l++ {
		name := testbed.KernelName(1, l)
		col.kernels[name] = sim.Span{Name: name, Start: t0.Add(layer * time.Duration(l)), End: t0.Add(layer * time.Duration(l+1))}
		col.order = append(col.order, name)
	}
	end := t0.Add(layer * time.Duration(g.layers)) // 253.952 ms
	// Room 0: the forward ends, its last wait returns 1 ms later, it posts
	// at 1.5, lands at 2.5, Finish returns at 3. Room 1 returns at 5.
	col.finishes = []finishRec{
		{room: 0, call: end.Add(-ms(10)), ret: end.Add(ms(3)), status: system.Succeeded,
			stats: system.ChunkStats{LastWait: end.Add(ms(1)), LastPost: end.Add(ms(1.5)), LastDone: end.Add(ms(2.5))}},
		{room: 1, call: end.Add(ms(4)), ret: end.Add(ms(5)), status: system.Succeeded},
	}
	col.batches = []system.Batch{{Seq: system.RestSeq, Bytes: 1000, Blocks: 2,
		EventDone: end, WaitStart: end.Add(-ms(1)), WaitEnd: end.Add(ms(0.2)), Posted: end.Add(ms(0.3)), Done: end.Add(ms(1.3))}}

	m := &ModeReport{PerLayer: true}
	m.summarize(cfg, g, p, col, t0, []time.Time{end})

	require.Len(t, m.PerRequest, 2)
	// TTFT: arrival (the start of the run) to the request's last Finish.
	assert.InDelta(t, 253.952+3, m.PerRequest[0].TTFTMs, 1e-6)
	assert.InDelta(t, 253.952+5, m.PerRequest[1].TTFTMs, 1e-6)
	assert.InDelta(t, 253.952+4, m.TTFTMs, 1e-6)
	assert.Zero(t, m.PerRequest[1].ArrivalMs)
	assert.InDelta(t, 3, m.PerRequest[0].ExposedMs, 1e-6)
	assert.InDelta(t, 5, m.PerRequest[1].ExposedMs, 1e-6)
	// Floors: the two MTP buffers (64 x 73 728 B = 4 718 592 B each, 94.37
	// us at 50 GB/s) leave at the end, room 1's behind room 0's.
	assert.InDelta(t, 0.09437184+0.01, m.PerRequest[0].FloorMs, 1e-5)
	assert.InDelta(t, 0.18874368+0.01, m.PerRequest[1].FloorMs, 1e-5)
	assert.InDelta(t, 4/((0.09437184+0.18874368)/2+0.01), m.RatioToFloor, 1e-3)
	assert.Equal(t, 2, m.RatioDist.N)
	assert.Nil(t, m.RatioDist.P99)
	// Room 0's exposed phases. Room 1 posted nothing (zero instants): its
	// detect, post and land are 0, and its 5 ms are all finish.
	ph := m.ExposedPhases
	assert.Equal(t, 2, ph["detect"].N)
	assert.InDelta(t, 1, ph["detect"].Max, 1e-6)
	assert.InDelta(t, 0.5, ph["post"].Max, 1e-6)
	assert.InDelta(t, 1, ph["land"].Max, 1e-6)
	assert.InDelta(t, 5, ph["finish"].Max, 1e-6)
	assert.InDelta(t, 0.5, ph["finish"].P50, 1e-6)
	// The batch's phases.
	assert.InDelta(t, 0.2, m.BatchPhases["detect"].P50, 1e-6)
	assert.InDelta(t, 0.1, m.BatchPhases["post"].P50, 1e-6)
	assert.InDelta(t, 1.0, m.BatchPhases["land"].P50, 1e-6)
	assert.Equal(t, 1, m.BatchPhases["land"].N)
	// Bytes: 1000 moved, x 3 modeled (585 MB of KV over a 256 MiB budget:
	// scale 3), over 1 ms.
	require.Equal(t, 3, g.scale)
	assert.Equal(t, uint64(1000), m.BytesMoved)
	assert.InDelta(t, 3000, m.BytesModeled, 1e-6)
	assert.InDelta(t, 3000/1e-3/1e9, m.EffectiveGBytePerS, 1e-9)
	assert.InDelta(t, 1000/1e-3/1e9, m.MovedGBytePerS, 1e-9)
}

// A forward holding request 0's last chunk and request 1's first: request
// 1's end-of-forward batch posted first is an inversion; posted second, or
// in a forward no request finishes in, it is not.
func TestInversions(t *testing.T) {
	p := &plan{forwards: [][]piece{
		{{room: 0, start: 0, end: 8192}},
		{{room: 0, start: 8192, end: 12288, last: true}, {room: 1, start: 0, end: 4096}},
		{{room: 1, start: 4096, end: 12288, last: true}, {room: 2, start: 0, end: 0}},
	}}
	t0 := time.Now()
	b := func(room uint64, start, seq int, at time.Duration) system.Batch {
		var c system.Batch
		c.Chunk.Room, c.Chunk.Start, c.Seq, c.Posted = room, start, seq, t0.Add(at)
		return c
	}
	shared, inv := inversions(p, []system.Batch{
		b(0, 0, -1, 1), b(1, 0, -1, 5), b(0, 8192, -1, 6), // forward 2: room 1's first: inverted
		b(0, 8192, 3, 0),                   // a group batch does not count
		b(1, 4096, -1, 9), b(2, 0, -1, 10), // forward 3: in order
	})
	assert.Equal(t, 2, shared)
	assert.Equal(t, 1, inv)
}
