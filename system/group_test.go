package system

import (
	"math"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dsv3Buffers is the default sim preset's pool: 61 hook layers and the MTP
// layer, one MLA buffer each of 64 tokens x 1152 B per page.
func dsv3Buffers() []Buffer {
	bases := make([]uint64, 62)
	for i := range bases {
		bases[i] = uint64(i+1) << 32
	}
	return MLABuffers(bases, 73728, 512)
}

// Hand-computed: 128 pages per forward are 9 437 184 B per layer, 0.18874
// ms at 400 Gb/s (50 GB/s); layers take 4.096 ms. Within 16 batches per
// forward K is at least 5 (61 hook layers: 13 groups and the MTP batch; K =
// 4 would cost 17). K = 5's last group is layer 60 alone: it is on the link
// 50 us after layer 60 ends and lands 0.18874 + 0.010 ms later, 3.84726 ms
// before the MTP layer ends. What follows the end is the MTP buffer: 50 us
// + 0.18874 + 0.010 ms.
func TestChooseGroupSmallestThatHides(t *testing.T) {
	m := GroupModel{LinkBytesPerSec: 50e9, Latency: 10 * time.Microsecond, PagesPerForward: 128, LayerTime: 4096 * time.Microsecond}
	ch, err := ChooseGroup(m, dsv3Buffers(), 61)
	require.NoError(t, err)
	assert.Equal(t, 5, ch.K)
	assert.Equal(t, 5, ch.Candidates[0].K, "K = 1..4 exceed the batch bound")
	c := ch.Candidates[0]
	assert.Equal(t, 14, c.Batches)
	assert.InDelta(t, 3.84726, float64(c.LastGroupSlack)/1e6, 1e-5)
	assert.InDelta(t, 0.24874, float64(c.Exposed)/1e6, 1e-5)
	assert.Contains(t, ch.Reason, "K = 5: the smallest K within 16 batches per forward (14) whose last group lands 3.847ms before the forward ends")
}

// A link much slower than the compute: nothing hides, and the choice is the
// candidate of least modeled exposed time.
func TestChooseGroupLeastExposedWhenNothingHides(t *testing.T) {
	m := GroupModel{LinkBytesPerSec: 12.5e9, Latency: 10 * time.Microsecond, PagesPerForward: 128, LayerTime: 100 * time.Microsecond, MaxBatches: 64}
	ch, err := ChooseGroup(m, dsv3Buffers(), 61)
	require.NoError(t, err)
	assert.Contains(t, ch.Reason, "no K within 64 batches per forward hides its last group")
	for _, c := range ch.Candidates {
		assert.Negative(t, c.LastGroupSlack, "K = %d", c.K)
		var chosen GroupCandidate
		for _, x := range ch.Candidates {
			if x.K == ch.K {
				chosen = x
			}
		}
		assert.LessOrEqual(t, chosen.Exposed, c.Exposed, "K = %d", c.K)
	}
}

func TestAutoGroupConfig(t *testing.T) {
	base := Config{Buffers: dsv3Buffers(), HookLayers: 61, PageSize: 64,
		AutoGroup: &GroupModel{LinkBytesPerSec: 50e9, Latency: 10 * time.Microsecond, PagesPerForward: 128, LayerTime: 4096 * time.Microsecond}}
	noEnv := func(string) string { return "" }
	c, err := base.withDefaults(noEnv)
	require.NoError(t, err)
	assert.Equal(t, 5, c.GroupSize)
	require.NotNil(t, c.chosen)

	both := base
	both.GroupSize = 8
	_, err = both.withDefaults(noEnv)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrBadInput))
	assert.Contains(t, err.Error(), "group size 8 and AutoGroup both set")

	bad := base
	bad.AutoGroup = &GroupModel{PagesPerForward: 128}
	_, err = bad.withDefaults(noEnv)
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)

	plain := base
	plain.AutoGroup = nil
	c, err = plain.withDefaults(noEnv)
	require.NoError(t, err)
	assert.Equal(t, DefaultGroupSize, c.GroupSize, "zero GroupSize without AutoGroup still means 8")
	assert.Nil(t, c.chosen)
}

// A buffer whose layer lies far past the hooks (a sentinel for "fires no
// hook": NewLayout takes any layer outside the hooks as hookless) used to
// size the model's per-layer table: math.MaxInt panicked with an index out
// of range, 1<<40 was a fatal out-of-memory error that no recover catches.
// It counts as one hookless layer, as the MTP layer right after the hooks
// does, and chooses the same K; so does a negative layer, which the model
// left out (its bytes, and the batch that sends them at the end).
func TestChooseGroupFarHooklessLayer(t *testing.T) {
	m := GroupModel{LinkBytesPerSec: 50e9, Latency: 10 * time.Microsecond, PagesPerForward: 128, LayerTime: 4096 * time.Microsecond}
	want, err := ChooseGroup(m, dsv3Buffers(), 61)
	require.NoError(t, err)
	for _, layer := range []int{1 << 40, math.MaxInt, -1, math.MinInt} {
		bufs := dsv3Buffers()
		bufs[61].Layer = layer
		got, err := ChooseGroup(m, bufs, 61)
		require.NoError(t, err, "layer %d", layer)
		assert.Equal(t, want, got, "layer %d", layer)
	}
}
