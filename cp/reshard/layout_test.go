package reshard

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// EvenStages by hand: 61 layers in 2 stages are 30 and 31, in 4 stages 15,
// 15, 15 and 16; one stage is nil.
func TestEvenStagesByHand(t *testing.T) {
	assert.Equal(t, []int{0, 30, 61}, EvenStages(61, 2))
	assert.Equal(t, []int{0, 15, 30, 45, 61}, EvenStages(61, 4))
	assert.Equal(t, []int{0, 1, 2}, EvenStages(2, 2))
	assert.Nil(t, EvenStages(61, 1))
	assert.Nil(t, EvenStages(61, 0))
}

// TestEvenStagesRefusesBeforeAllocating: a pp the layers cannot hold (more
// stages than layers, negative), or layers outside [1, MaxLayers], is
// refused before anything is sized from it: SplitStages says so, and
// EvenStages returns a list of one boundary that NewPlan refuses, never a
// list of pp+1. kvstream sim --decode-pp 9223372036854775807 panicked in
// makeslice here; --prefill-pp 1000000000000 ran out of memory.
func TestEvenStagesRefusesBeforeAllocating(t *testing.T) {
	for _, tc := range []struct {
		layers, pp int
		want       string
	}{
		{2, 3, "PP 3: more stages than the 2 layers"},
		{61, 1 << 62, "PP 4611686018427387904: more stages than the 61 layers"},
		{61, 1000000000000, "PP 1000000000000: more stages than the 61 layers"},
		{61, -1, "PP -1: must not be negative"},
		{1 << 40, 1 << 39, "PP 549755813888 over 1099511627776 layers: the layers must be in [1, 4096]"},
		{0, 2, "PP 2 over 0 layers"},
	} {
		allocs := testing.AllocsPerRun(1, func() {
			got, err := SplitStages(tc.layers, tc.pp)
			require.Error(t, err, "%d layers, pp %d", tc.layers, tc.pp)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, errors.Is(err, ErrBadInput))
			assert.Nil(t, got)
		})
		assert.Less(t, allocs, 100.0, "nothing sized from pp %d", tc.pp)
		stages := EvenStages(tc.layers, tc.pp)
		assert.Equal(t, []int{0}, stages, "%d layers, pp %d", tc.layers, tc.pp)
		if tc.layers >= 1 && tc.layers <= MaxLayers {
			s := gqa(1, TokenMajor)
			s.Layers, s.Stages = tc.layers, stages
			p := Pairing{Prefill: s, Decode: s}
			_, err := NewPlan(&p, Rank{})
			assert.ErrorContains(t, err, "prefill: 1 PP stage boundaries (0 stages)")
		}
	}
	got, err := SplitStages(61, 61)
	require.NoError(t, err)
	assert.Len(t, got, 62)
	got, err = SplitStages(61, 0)
	require.NoError(t, err)
	assert.Nil(t, got)
}
