package plan

import (
	"math"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// NewLayout sized its group table from hook layers it did not bound:
// math.MaxInt in groups of 2 panicked in makeslice (the group count had
// wrapped negative), 1<<40 in groups of 1 ran out of memory. A buffer's
// item length and pages were bounded below only, and its end could wrap.
// Each is refused, naming the value (and the buffer), before anything is
// allocated from it.
func TestNewLayoutRefusesBeyondBounds(t *testing.T) {
	good := Buffer{Name: "KV0", Base: 0x1000, ItemLen: 16, Pages: 4}
	for _, tc := range []struct {
		name     string
		bufs     []Buffer
		hooks, k int
		want     string
	}{
		{"hook layers MaxInt", []Buffer{good}, math.MaxInt, 2, "hook layers 9223372036854775807: must be at most 4096"},
		{"hook layers 2^40", []Buffer{good}, 1 << 40, 1, "hook layers 1099511627776: must be at most 4096"},
		{"item length", []Buffer{good, {Name: "KV1", Base: 0x1000, ItemLen: 1<<63 + 1024, Pages: 2}}, 1, 1,
			"buffer 1 (KV1): item length 9223372036854776832: must be at most 268435456"},
		{"pages", []Buffer{{Name: "KV0", Base: 0x1000, ItemLen: 1, Pages: math.MaxInt}}, 1, 1,
			"buffer 0 (KV0): 9223372036854775807 pages: must be at most 16777216"},
		{"wraps", []Buffer{{Name: "KV0", Base: math.MaxUint64 - 1023, ItemLen: 1024, Pages: 2}}, 1, 1,
			"buffer 0 (KV0): [0xfffffffffffffc00, +2048) wraps around"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l *Layout
			var err error
			require.NotPanics(t, func() {
				l, err = NewLayout(tc.bufs, make([]rdma.LocalKey, len(tc.bufs)), tc.hooks, tc.k, 4, cp.CP{Size: 1})
			})
			require.Error(t, err)
			assert.Nil(t, l)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	_, err := NewLayout([]Buffer{{Name: "KV0", Base: 0x1000, ItemLen: MaxItemLen, Pages: MaxPages}}, make([]rdma.LocalKey, 1), MaxHookLayers, 1, 4, cp.CP{Size: 1})
	require.NoError(t, err, "the bounds themselves are accepted")
}

// ResolvePeer took any region that held a page: one at MaxUint64-1023 of
// 1 MiB (it wraps around the address space) was added, and its writes
// failed later as a submitter restart storm; one of 2^63 bytes of 1-byte
// pages made Pages() negative, and the next Register failed as a bug
// ("planning ... panicked"). A region must be whole pages of its item
// length, at most MaxPages, within the address space; errors name the
// peer and the buffer.
func TestResolvePeerRefusesBadRegions(t *testing.T) {
	one := []Buffer{{Name: "KV0", Base: 0x1000, ItemLen: 1, Pages: 4}}
	small, err := NewLayout(one, make([]rdma.LocalKey, 1), 1, 1, 4, cp.CP{Size: 1})
	require.NoError(t, err)
	l, _ := fixture(t, cp.CP{Size: 1})
	region := func(addr, n uint64) rdma.RegionDesc { return rdma.RegionDesc{Addr: addr, Len: n, Key: []byte{1}} }
	peer := func(bufs ...PeerBuffer) Peer { return Peer{ID: "p", Address: []byte("a"), Buffers: bufs} }
	ok := PeerBuffer{Region: region(0x90000, 32*16), ItemLen: 16}
	for _, tc := range []struct {
		name   string
		layout *Layout
		peer   Peer
		want   string
	}{
		{"wraps", l, peer(ok, PeerBuffer{Region: region(math.MaxUint64-1023, 1<<20), ItemLen: 16}, ok),
			`peer "p" buffer 1: region [0xfffffffffffffc00, +1048576) wraps around`},
		{"negative pages", small, peer(PeerBuffer{Region: region(0x1000, 1<<63), ItemLen: 1}),
			`peer "p" buffer 0: region of 9223372036854775808 bytes holds 9223372036854775808 pages of 1 bytes: must be at most 16777216`},
		{"too many pages", l, peer(ok, ok, PeerBuffer{Region: region(0x1000, 16*(MaxPages+1)), ItemLen: 16}),
			`peer "p" buffer 2: region of 268435472 bytes holds 16777217 pages of 16 bytes: must be at most 16777216`},
		{"not whole pages", l, peer(ok, PeerBuffer{Region: region(0x1000, 32*16+1), ItemLen: 16}, ok),
			`peer "p" buffer 1: region of 513 bytes is not a whole number of 16-byte pages`},
		{"zero item length", l, peer(ok, ok, PeerBuffer{Region: region(0x1000, 32*16)}),
			`peer "p" buffer 2: item length 0, prefill 16`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rp *Peer
			var err error
			require.NotPanics(t, func() { rp, err = ResolvePeer(tc.layout, tc.peer) })
			require.Error(t, err)
			assert.Nil(t, rp)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	assert.Equal(t, 0, PeerBuffer{Region: region(0x1000, 64)}.Pages(), "a zero item length holds no page")
	assert.Equal(t, math.MaxInt, PeerBuffer{Region: region(0x1000, math.MaxUint64), ItemLen: 1}.Pages(), "never negative")
}

// A resharded peer's regions are checked the same way.
func TestResolveShardedPeerRefusesBadRegions(t *testing.T) {
	l := shardedLayout(t, 2, 1)
	p := shardedPeer("c", gqaSide(4), reshard.Rank{TP: 2})
	_, err := ResolvePeer(l, p)
	require.NoError(t, err)
	p.Buffers[3].Region.Addr = math.MaxUint64 - 7
	_, err = ResolvePeer(l, p)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, `peer "c" buffer 3: region [0xfffffffffffffff8, +`)
	assert.ErrorContains(t, err, ") wraps around")
}

// A chunk ending at math.MaxInt: BuildPlan's error named a negative page
// count (cp.ChunkRange overflowed); it names the exact one.
func TestBuildPlanHugeEnd(t *testing.T) {
	l, peers := fixture(t, cp.CP{Size: 1})
	spec := &ChunkSpec{Room: 1, End: math.MaxInt, Last: true, SrcPages: []int{0}, Infos: []DecodeInfo{{Peer: "d0", DstPages: []int{0}}}}
	var err error
	require.NotPanics(t, func() { _, err = BuildPlan(l, peers, spec, cp.EveryDestination) })
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "room 1 chunk [0, 9223372036854775807): 1 source pages, the range needs 2305843009213693952")
}
