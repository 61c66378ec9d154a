package workload

import (
	"testing"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordingEndpoint keeps the done of every batch posted, for the test to
// complete when it chooses.
type recordingEndpoint struct {
	rdma.Endpoint
	dones []func(error)
}

func (e *recordingEndpoint) Post(_ []rdma.Write, done func(error)) error {
	e.dones = append(e.dones, done)
	return nil
}

// The guard's verdicts on one chunk of two pages in a pool of one buffer
// (pages of 16 bytes at address 0x1000): a SUCCESS after every batch landed
// passes; a SUCCESS with a batch in flight, and a batch posted after the
// SUCCESS, fail naming room, chunk, position, decode page and buffer.
func TestLandGuard(t *testing.T) {
	locate := func(addr uint64) (destPage, bool) {
		if addr < 0x1000 || addr >= 0x1000+16*8 {
			return destPage{}, false
		}
		return destPage{page: int(addr-0x1000) / 16}, true
	}
	name := func(destPage) string { return "KV0" }
	newGuard := func() (*landGuard, *recordingEndpoint) {
		g := newLandGuard(nil, locate, name)
		ep := &recordingEndpoint{}
		g.expect(3, 0, 128, []int{0, 1}, []int{5, 6})
		return g, ep
	}
	write := func(page int) []rdma.Write { return []rdma.Write{{Dst: 0x1000 + uint64(page)*16, Len: 16}} }

	g, ep := newGuard()
	gep := &guardedEndpoint{Endpoint: ep, g: g}
	require.NoError(t, gep.Post(write(5), func(error) {}))
	require.NoError(t, gep.Post(write(6), func(error) {}))
	ep.dones[0](nil)
	ep.dones[1](nil)
	g.finished(3, 0)
	assert.Empty(t, g.violations())

	g, ep = newGuard()
	gep = &guardedEndpoint{Endpoint: ep, g: g}
	require.NoError(t, gep.Post(write(5), func(error) {}))
	require.NoError(t, gep.Post(write(6), func(error) {}))
	ep.dones[0](nil)
	g.finished(3, 0)
	require.Len(t, g.violations(), 1)
	assert.Contains(t, g.violations()[0], "room 3 chunk 0-128 position 1 (decode page 6) buffer KV0: Finish returned SUCCESS with 1 batch(es)")

	g, ep = newGuard()
	gep = &guardedEndpoint{Endpoint: ep, g: g}
	g.finished(3, 0)
	require.NoError(t, gep.Post(write(5), func(error) {}))
	require.Len(t, g.violations(), 1)
	assert.Contains(t, g.violations()[0], "room 3 chunk 0-128 position 0 (decode page 5) buffer KV0: a batch posted after the chunk's Finish returned SUCCESS")

	// A write to a page no chunk owns, or outside the decode pool.
	g, ep = newGuard()
	gep = &guardedEndpoint{Endpoint: ep, g: g}
	require.NoError(t, gep.Post(write(7), func(error) {}))
	require.NoError(t, gep.Post([]rdma.Write{{Dst: 0x10, Len: 16}}, func(error) {}))
	assert.Equal(t, []string{"decode page 7 buffer KV0: written by a batch of no registered chunk",
		"write 0 of a batch: destination 0x10 is in no decode buffer"}, g.violations())
}

func TestBelowBound(t *testing.T) {
	assert.Empty(t, belowBound(1, 0.199, 0.199))
	assert.Empty(t, belowBound(1, 0.1985, 0.199)) // within the rounding slack
	assert.Contains(t, belowBound(2, 0.150, 0.199), "room 2: exposed 0.150 ms is below 0.199 ms")
}

// locate finds the decode rank, buffer and page of any address inside a
// decode buffer, at the first and last byte of each, and nothing in the gaps
// between buffers or past the last; the buffers of the two ranks interleave
// in the address space, so a search that assumed one rank's buffers are
// contiguous would misplace them.
func TestShardedLocate(t *testing.T) {
	pool := func(bases ...uint64) *testbed.Decode {
		return &testbed.Decode{Pool: &testbed.Pool{Geometry: testbed.Geometry{ItemLen: 16, Pages: 4, Names: []string{"K", "V"}}, Bases: bases}}
	}
	d := &shardedDecode{pools: []*testbed.Decode{pool(0x1000, 0x3000), pool(0x2000, 0x1040)}}
	d.regions = indexPools(d.pools)
	for _, c := range []struct {
		addr uint64
		want destPage
		ok   bool
	}{
		{0x0fff, destPage{}, false},
		{0x1000, destPage{rank: 0, buffer: 0, page: 0}, true},
		{0x103f, destPage{rank: 0, buffer: 0, page: 3}, true},
		{0x1040, destPage{rank: 1, buffer: 1, page: 0}, true},
		{0x107f, destPage{rank: 1, buffer: 1, page: 3}, true},
		{0x1080, destPage{}, false},
		{0x2010, destPage{rank: 1, buffer: 0, page: 1}, true},
		{0x3030, destPage{rank: 0, buffer: 1, page: 3}, true},
		{0x3040, destPage{}, false},
	} {
		got, ok := d.regions.locate(c.addr)
		assert.Equal(t, c.ok, ok, "%#x", c.addr)
		assert.Equal(t, c.want, got, "%#x", c.addr)
	}
	assert.Equal(t, "V of decode rank 1", d.bufferName(destPage{rank: 1, buffer: 1, page: 2}))
}
