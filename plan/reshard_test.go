package plan

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gqaSide is 4 layers of 8 KV heads of 2 bytes, page size 4, head-major.
func gqaSide(tp int) reshard.Side {
	return reshard.Side{Layers: 4, KVHeads: 8, HeadDim: 1, ElemBytes: 2, TP: tp, PageSize: 4, Order: reshard.HeadMajor}
}

// shardedLayout is prefill rank tp of gqaSide(ptp) with 3 hook layers (layer
// 3 is the hookless MTP layer), buffers K0..K3 then V0..V3.
func shardedLayout(t *testing.T, ptp, tp int) *Layout {
	t.Helper()
	side := gqaSide(ptp)
	var bufs []Buffer
	for kind, name := range []string{"K", "V"} {
		for l := 0; l < 4; l++ {
			bufs = append(bufs, Buffer{Name: name, Base: uint64(0x100000 * (1 + kind*4 + l)), ItemLen: side.ItemLen(), Pages: 16, Layer: l})
		}
	}
	l, err := NewLayout(bufs, make([]rdma.LocalKey, len(bufs)), 3, 2, 4, cp.CP{Size: 1})
	require.NoError(t, err)
	require.NoError(t, l.SetSharding(&Sharding{Side: side, Rank: reshard.Rank{TP: tp}}, reshard.SpreadReplicas))
	return l
}

func shardedPeer(id string, side reshard.Side, rank reshard.Rank) Peer {
	p := Peer{ID: id, Address: []byte("a"), Sharding: &Sharding{Side: side, Rank: rank}}
	lo, hi := side.StageLayers(rank.Stage)
	for i := 0; i < (hi-lo)*side.Kinds(); i++ {
		p.Buffers = append(p.Buffers, PeerBuffer{Region: rdma.RegionDesc{Addr: uint64(0x1000000 * (i + 1)), Len: 16 * side.ItemLen()}, ItemLen: side.ItemLen()})
	}
	return p
}

// TP 2 -> 4: prefill rank 1 holds heads 4-7, decode ranks 2 and 3 hold 4-5
// and 6-7; ranks 0 and 1 receive nothing from it. Every prefill buffer
// feeds the decode buffer of the same layer and kind.
func TestResolvePeerRoutes(t *testing.T) {
	l := shardedLayout(t, 2, 1)
	peers := map[string]*Peer{}
	for d := 0; d < 4; d++ {
		id := string(rune('a' + d))
		p, err := ResolvePeer(l, shardedPeer(id, gqaSide(4), reshard.Rank{TP: d}))
		require.NoError(t, err)
		peers[id] = p
	}
	assert.True(t, peers["a"].Route().Empty())
	assert.True(t, peers["b"].Route().Empty())
	r := peers["c"].Route()
	require.False(t, r.Empty())
	assert.Equal(t, [2]int{4, 6}, [2]int{r.HeadLo, r.HeadHi})
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, r.DstBuffers)
	assert.Equal(t, uint64(2*4*2), r.PageBytes(), "2 heads x 4 tokens x 2 bytes")

	get := func(id string) (*Peer, bool) { p, ok := peers[id]; return p, ok }
	spec := &ChunkSpec{Room: 1, End: 8, Last: true, SrcPages: []int{0, 1},
		Infos: []DecodeInfo{{Peer: "a", DstPages: []int{0, 1}}, {Peer: "c", DstPages: []int{2, 3}}, {Peer: "d", DstPages: []int{4, 5}}}}
	p, err := BuildPlan(l, get, spec, cp.EveryDestination)
	require.NoError(t, err)
	assert.Equal(t, cp.PerLayer, p.Mode)
	assert.Equal(t, cp.SeveralDestinations, p.Reason, "a routes nothing from this rank: like a dummy")
	require.Len(t, p.Dests, 2)
	assert.Equal(t, []int{1, 2}, []int{p.Dests[0].Info, p.Dests[1].Info})
	assert.Same(t, peers["c"].Route(), p.Dests[0].Route)
	assert.Equal(t, uint64(2*8*16*2), p.Bytes(l), "2 destinations x 8 buffers x 16 bytes x 2 pages")

	spec.Infos = spec.Infos[:1]
	p, err = BuildPlan(l, get, spec, cp.EveryDestination)
	require.NoError(t, err)
	assert.True(t, p.Empty())
	assert.Equal(t, cp.AllDummy, p.Reason, "nothing routes from this rank")
}

// PP: prefill holds all 4 layers, decode stage 1 holds layers [2, 4): only
// those buffers route, to the stage's buffers K2 K3 V2 V3 = 0 1 2 3.
func TestResolvePeerStages(t *testing.T) {
	l := shardedLayout(t, 2, 0)
	dec := gqaSide(2)
	dec.Stages = []int{0, 2, 4}
	p, err := ResolvePeer(l, shardedPeer("d", dec, reshard.Rank{TP: 0, Stage: 1}))
	require.NoError(t, err)
	assert.Equal(t, []int{-1, -1, 0, 1, -1, -1, 2, 3}, p.Route().DstBuffers)
	assert.True(t, p.Route().Whole, "same heads, same order: whole pages")
	assert.False(t, p.Route().Sends([]int{0, 1, 4, 5}), "group 0 (layers 0, 1) sends it nothing")
	assert.True(t, p.Route().Sends([]int{2, 6}))
}

func TestShardingBadInput(t *testing.T) {
	l := shardedLayout(t, 2, 0)
	mla := reshard.Side{Layers: 4, KVHeads: 1, HeadDim: 2, ElemBytes: 2, MLA: true, TP: 2, PageSize: 4}
	odd := gqaSide(2)
	odd.HeadDim = 3
	for _, tc := range []struct {
		name string
		peer Peer
		want string
	}{
		{"heads do not split", shardedPeer("p", gqaSide(3), reshard.Rank{}), `peer "p": decode: 8 KV heads do not split over TP 3`},
		{"head dims differ", shardedPeer("p", odd, reshard.Rank{}), `peer "p": prefill head dim 1, decode 3`},
		{"MLA against GQA", shardedPeer("p", mla, reshard.Rank{}), "prefill MLA false, decode MLA true: the KV formats differ"},
		{"decode rank", shardedPeer("p", gqaSide(4), reshard.Rank{TP: 4}), "decode: TP rank 4: must be in [0, 4)"},
		{"buffer count", func() Peer { p := shardedPeer("p", gqaSide(4), reshard.Rank{}); p.Buffers = p.Buffers[1:]; return p }(), "has 7 buffers, its PP stage 0 holds 4 layers x 2 buffers"},
		{"item length", func() Peer { p := shardedPeer("p", gqaSide(4), reshard.Rank{}); p.Buffers[3].ItemLen = 8; return p }(), "buffer 3: item length 8, its sharding gives 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ResolvePeer(l, tc.peer)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	plain, _ := fixture(t, cp.CP{Size: 1})
	_, err := ResolvePeer(plain, shardedPeer("p", gqaSide(2), reshard.Rank{}))
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrBadInput))
	assert.Contains(t, err.Error(), `peer "p" gives its sharding (TP 2 rank 0), the engine none`)

	for _, tc := range []struct {
		name string
		side reshard.Side
		rank reshard.Rank
		want string
	}{
		{"page size", func() reshard.Side { s := gqaSide(2); s.PageSize = 8; return s }(), reshard.Rank{}, "page size 8, the layout's 4"},
		{"rank", gqaSide(2), reshard.Rank{TP: 2}, "prefill: TP rank 2: must be in [0, 2)"},
		{"stage layers", func() reshard.Side { s := gqaSide(2); s.Stages = []int{0, 2, 4}; return s }(), reshard.Rank{}, "8 buffers, PP stage 0 holds 2 layers x 2 buffers"},
		{"item length", gqaSide(1), reshard.Rank{}, "buffer 0 (K): item length 32, the prefill sharding gives 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := shardedLayout(t, 2, 0)
			err := l.SetSharding(&Sharding{Side: tc.side, Rank: tc.rank}, reshard.SpreadReplicas)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
