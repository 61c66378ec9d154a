package landguard

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

// pool is a decode rank's pool of 4 pages of 16 bytes per buffer.
func pool(bases ...uint64) *testbed.Decode {
	names := []string{"K", "V", "X"}[:len(bases)]
	return &testbed.Decode{Pool: &testbed.Pool{Geometry: testbed.Geometry{ItemLen: 16, Pages: 8, Names: names}, Bases: bases}}
}

// rig is an oracle over pools, one guard per prefill rank, each over an
// endpoint that completes only when told.
type rig struct {
	o   *Oracle
	g   []*Guard
	eps []*recordingEndpoint
}

func newRig(ranks int, pools ...*testbed.Decode) *rig {
	r := &rig{o: New(NewPools(pools, nil))}
	for range ranks {
		r.g = append(r.g, r.o.Wrap(nil))
		r.eps = append(r.eps, &recordingEndpoint{})
	}
	return r
}

// post posts ws from prefill rank i.
func (r *rig) post(t *testing.T, i int, ws ...rdma.Write) {
	t.Helper()
	ep := &guardedEndpoint{Endpoint: r.eps[i], g: r.g[i]}
	require.NoError(t, ep.Post(ws, func(error) {}))
}

func write(base uint64, page int) rdma.Write {
	return rdma.Write{Dst: base + uint64(page)*16, Len: 16}
}

// The guard's verdicts on one chunk of two pages in a pool of one buffer
// (pages of 16 bytes at address 0x1000): a SUCCESS after every batch landed
// passes; a SUCCESS with a batch in flight, and a batch posted after the
// SUCCESS, fail naming room, chunk, position, decode page and buffer.
func TestGuard(t *testing.T) {
	newGuard := func() *rig {
		r := newRig(1, pool(0x1000))
		r.g[0].Expect(3, 0, 128, []int{0, 1}, []int{5, 6})
		return r
	}

	r := newGuard()
	r.post(t, 0, write(0x1000, 5))
	r.post(t, 0, write(0x1000, 6))
	r.eps[0].dones[0](nil)
	r.eps[0].dones[1](nil)
	r.g[0].Finished(3, 0)
	assert.Empty(t, r.o.Violations())

	r = newGuard()
	r.post(t, 0, write(0x1000, 5))
	r.post(t, 0, write(0x1000, 6))
	r.eps[0].dones[0](nil)
	r.g[0].Finished(3, 0)
	v := r.o.Violations()
	require.NotEmpty(t, v)
	assert.Contains(t, v[0], "room 3 chunk 0-128 position 1 (decode page 6) buffer K: Finish returned SUCCESS with 1 batch(es)")

	r = newGuard()
	r.g[0].Finished(3, 0)
	r.post(t, 0, write(0x1000, 5))
	v = r.o.Violations()
	require.NotEmpty(t, v)
	assert.Contains(t, v[0], "room 3 chunk 0-128 position 0 (decode page 5) buffer K: a batch posted after the chunk's Finish returned SUCCESS")

	// A write to a page no chunk owns, or outside the decode pool.
	r = newGuard()
	r.post(t, 0, write(0x1000, 7))
	r.post(t, 0, rdma.Write{Dst: 0x10, Len: 16})
	assert.Equal(t, []string{"decode page 7 buffer K: written by a batch of no registered chunk",
		"write 0 of a batch: destination 0x10 is in no decode buffer"}, r.o.Violations())
}

// The ledger, on a chunk of two pages (5 and 6) over two decode ranks of
// two buffers each, 16-byte pages: each rank needs 2 pages × 2 buffers ×
// 16 = 64 bytes. Two prefill ranks each send half of every page (a TP
// split): 8 bytes per page and buffer, 32 bytes per decode rank each.
func TestLedger(t *testing.T) {
	k0, v0, k1, v1 := uint64(0x1000), uint64(0x2000), uint64(0x3000), uint64(0x4000)
	keys := []int{PageKey(0, 5), PageKey(1, 5), PageKey(0, 6), PageKey(1, 6)}
	half := func(base uint64, page, part int) rdma.Write {
		return rdma.Write{Dst: base + uint64(page)*16 + uint64(part)*8, Len: 8}
	}
	// send posts prefill rank p's half of every page, one batch per decode
	// rank (an endpoint reaches one), and completes them with err.
	send := func(t *testing.T, r *rig, p int, err error) {
		r.post(t, p, half(k0, 5, p), half(v0, 5, p), half(k0, 6, p), half(v0, 6, p))
		r.post(t, p, half(k1, 5, p), half(v1, 5, p), half(k1, 6, p), half(v1, 6, p))
		n := len(r.eps[p].dones)
		r.eps[p].dones[n-2](err)
		r.eps[p].dones[n-1](err)
	}
	newLedger := func() *rig {
		r := newRig(2, pool(k0, v0), pool(k1, v1))
		for _, g := range r.g {
			g.Expect(9, 0, 32, []int{0, 1}, keys)
		}
		return r
	}

	r := newLedger()
	send(t, r, 0, nil)
	send(t, r, 1, nil)
	r.g[0].Finished(9, 0)
	assert.Empty(t, r.o.Violations(), "one prefill rank still to finish: not judged yet")
	r.g[1].Finished(9, 0)
	assert.Empty(t, r.o.Violations(), "every byte once")

	// Both TP replicas send the whole page (the audit's planted bug): the
	// bytes are right, twice.
	r = newLedger()
	send(t, r, 0, nil)
	send(t, r, 1, nil)
	send(t, r, 0, nil)
	send(t, r, 1, nil)
	r.g[0].Finished(9, 0)
	r.g[1].Finished(9, 0)
	assert.Equal(t, []string{
		"room 9 chunk 0-32 decode rank 0: 128 bytes landed, its 2 registered pages need 64 (64 bytes too many: every byte 2 times)",
		"room 9 chunk 0-32 decode rank 1: 128 bytes landed, its 2 registered pages need 64 (64 bytes too many: every byte 2 times)",
	}, r.o.Violations())

	// One prefill rank's batches failed and were posted again: counted
	// once. Without the second post, a shortfall.
	r = newLedger()
	send(t, r, 0, nil)
	send(t, r, 1, rdma.ErrEndpointBroken)
	send(t, r, 1, nil)
	r.g[0].Finished(9, 0)
	r.g[1].Finished(9, 0)
	assert.Empty(t, r.o.Violations(), "a failed batch posted again counts once")

	r = newLedger()
	send(t, r, 0, nil)
	r.g[0].Finished(9, 0)
	r.g[1].Finished(9, 0)
	assert.Equal(t, []string{
		"room 9 chunk 0-32 decode rank 0: 32 bytes landed, its 2 registered pages need 64 (32 bytes missing)",
		"room 9 chunk 0-32 decode rank 1: 32 bytes landed, its 2 registered pages need 64 (32 bytes missing)",
	}, r.o.Violations())

	// A chunk that did not succeed everywhere promised nothing.
	r = newLedger()
	send(t, r, 0, nil)
	r.g[0].Finished(9, 0)
	assert.Empty(t, r.o.Violations())
}

// Locate finds the decode rank, buffer and page of any address inside a
// decode buffer, at the first and last byte of each, and nothing in the gaps
// between buffers or past the last; the buffers of the two ranks interleave
// in the address space, so a search that assumed one rank's buffers are
// contiguous would misplace them.
func TestLocate(t *testing.T) {
	short := func(bases ...uint64) *testbed.Decode {
		return &testbed.Decode{Pool: &testbed.Pool{Geometry: testbed.Geometry{ItemLen: 16, Pages: 4, Names: []string{"K", "V"}}, Bases: bases}}
	}
	p := NewPools([]*testbed.Decode{short(0x1000, 0x3000), short(0x2000, 0x1040)}, nil)
	for _, c := range []struct {
		addr uint64
		want Dest
		ok   bool
	}{
		{0x0fff, Dest{}, false},
		{0x1000, Dest{Rank: 0, Buffer: 0, Page: 0}, true},
		{0x103f, Dest{Rank: 0, Buffer: 0, Page: 3}, true},
		{0x1040, Dest{Rank: 1, Buffer: 1, Page: 0}, true},
		{0x107f, Dest{Rank: 1, Buffer: 1, Page: 3}, true},
		{0x1080, Dest{}, false},
		{0x2010, Dest{Rank: 1, Buffer: 0, Page: 1}, true},
		{0x3030, Dest{Rank: 0, Buffer: 1, Page: 3}, true},
		{0x3040, Dest{}, false},
	} {
		got, ok := p.Locate(c.addr)
		assert.Equal(t, c.ok, ok, "%#x", c.addr)
		assert.Equal(t, c.want, got, "%#x", c.addr)
	}
	assert.Equal(t, "V of decode rank 1", p.Name(Dest{Rank: 1, Buffer: 1, Page: 2}))
}
