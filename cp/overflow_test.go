package cp

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Count computed (F+K-1)/K, which wraps around for F near math.MaxInt:
// math.MaxInt hook layers in groups of 2 counted -4611686018427387904
// groups, and the layout's make of that many panicked. It divides first,
// and agrees with the plain formula wherever that does not overflow; so
// does Layers, whose (i+1)*K wrapped the same way.
func TestGroupsCountDoesNotOverflow(t *testing.T) {
	g, err := NewGroups(math.MaxInt, 2)
	require.NoError(t, err)
	assert.Equal(t, math.MaxInt/2+1, g.Count())
	lo, hi := g.Layers(g.Count() - 1)
	assert.Equal(t, [2]int{math.MaxInt - 1, math.MaxInt}, [2]int{lo, hi}, "the last group is layer MaxInt-1 alone")

	g, err = NewGroups(math.MaxInt, math.MaxInt/2+1)
	require.NoError(t, err)
	assert.Equal(t, 2, g.Count())
	lo, hi = g.Layers(1)
	assert.Equal(t, [2]int{math.MaxInt/2 + 1, math.MaxInt}, [2]int{lo, hi})
	assert.True(t, g.Boundary(math.MaxInt-1))

	g, err = NewGroups(math.MaxInt, math.MaxInt)
	require.NoError(t, err)
	assert.Equal(t, 1, g.Count())

	for f := 1; f <= 40; f++ {
		for k := 1; k <= 45; k++ {
			g := Groups{F: f, K: k}
			require.Equal(t, (f+k-1)/k, g.Count(), "F %d K %d", f, k)
			for i := 0; i < g.Count(); i++ {
				lo, hi := g.Layers(i)
				require.Equal(t, [2]int{i * k, min((i+1)*k, f)}, [2]int{lo, hi}, "F %d K %d group %d", f, k, i)
			}
		}
	}
}

// The page count was end - start + pageSize - 1 over pageSize, which
// wrapped for an end near math.MaxInt: a chunk ending there "needed"
// -576460752303423487 pages, which then appeared in BuildPlan's error. It
// is the exact count now.
func TestChunkRangeDoesNotOverflow(t *testing.T) {
	r, err := ChunkRange(0, math.MaxInt, 16, true)
	require.NoError(t, err)
	assert.Equal(t, math.MaxInt/16+1, r.Pages)
	assert.Equal(t, math.MaxInt, r.End)

	r, err = ChunkRange(16, math.MaxInt, 16, false)
	require.NoError(t, err)
	assert.Equal(t, math.MaxInt-math.MaxInt%16, r.End)
	assert.Equal(t, math.MaxInt/16-1, r.Pages)
	assert.Equal(t, 1, r.PageStart)

	r, err = ChunkRange(0, math.MaxInt, 1, true)
	require.NoError(t, err)
	assert.Equal(t, math.MaxInt, r.Pages)

	r, err = ChunkRange(math.MaxInt-math.MaxInt%8, math.MaxInt, 8, true)
	require.NoError(t, err)
	assert.Equal(t, 1, r.Pages)
}
