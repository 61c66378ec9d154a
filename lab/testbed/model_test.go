package testbed

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A kernel writes its pages' pattern at its end, and its launch reuses the
// output page list of a kernel that ran: once warm, a launch allocates its
// three closures and nothing that grows with the pages it writes (a list
// per kernel per forward brought the collector into the sim's timed
// windows).
func TestWriteLayerReusesItsPageList(t *testing.T) {
	pool, err := NewPool(MLA(2, 64, 256))
	require.NoError(t, err)
	defer func() { require.NoError(t, pool.Free()) }()
	pages := make([]int, 200)
	for i := range pages {
		pages[i] = i
	}
	m := &Model{Pool: pool, Seed: 7}
	writes := []Write{{Room: 3, SrcPages: pages, Tokens: len(pages)}}
	launch := func() {
		start, prepare, run := m.writeLayer(1, writes)
		start()
		prepare()
		run()
	}
	launch()
	want := make([]byte, pool.ItemLen)
	for _, i := range []int{0, 199} {
		Fill(want, 7, 3, 1, i)
		assert.True(t, bytes.Equal(want, pool.Page(1, i)), "page %d of buffer 1 holds its pattern", i)
	}
	assert.Equal(t, make([]byte, pool.ItemLen), pool.Page(0, 0), "the other layer's buffer is untouched")
	allocs := testing.AllocsPerRun(20, launch)
	assert.LessOrEqual(t, allocs, 4.0, "a warm launch of a 200-page kernel allocates its closures only")
}
