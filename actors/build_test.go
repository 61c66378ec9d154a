package actors

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/plan"
	"github.com/stretchr/testify/require"
)

// llama70b is the model of the issue: 80 layers of 8 KV heads of 128 bf16.
func llama70b(tp int, order reshard.Order) reshard.Side {
	return reshard.Side{Layers: 80, KVHeads: 8, HeadDim: 128, ElemBytes: 2, TP: tp, PageSize: 64, Order: order}
}

// buildFixture is prefill rank 0 of pre (80 hook layers in groups of 8), a
// chunk of 100k tokens on scattered pages toward decode rank 0 of dec (nil:
// no sharding, today's path), and the peer's bases and keys.
func buildFixture(tb testing.TB, pre, dec *reshard.Side) (*plan.Layout, *plan.Dest, []uint64, []rdma.RemoteKey) {
	tb.Helper()
	const tokens = 100_000
	pages := (tokens + 63) / 64
	var bufs []plan.Buffer
	for kind := 0; kind < 2; kind++ {
		for l := 0; l < 80; l++ {
			bufs = append(bufs, plan.Buffer{Name: fmt.Sprint(kind, l), Base: uint64(len(bufs)+1) << 36, ItemLen: pre.ItemLen(), Pages: pages, Layer: l})
		}
	}
	l, err := plan.NewLayout(bufs, make([]rdma.LocalKey, len(bufs)), 80, 8, 64, cp.CP{Size: 1})
	require.NoError(tb, err)
	peer := plan.Peer{ID: "d", Address: []byte("a")}
	item := pre.ItemLen()
	if dec != nil {
		require.NoError(tb, l.SetSharding(&plan.Sharding{Side: *pre}, reshard.SpreadReplicas))
		peer.Sharding = &plan.Sharding{Side: *dec}
		item = dec.ItemLen()
	}
	bases := make([]uint64, len(bufs))
	keys := make([]rdma.RemoteKey, len(bufs))
	for i := range bufs {
		bases[i] = uint64(i+1) << 40
		peer.Buffers = append(peer.Buffers, plan.PeerBuffer{Region: rdma.RegionDesc{Addr: bases[i], Len: item * uint64(pages)}, ItemLen: item})
	}
	p, err := plan.ResolvePeer(l, peer)
	require.NoError(tb, err)
	rng := rand.New(rand.NewPCG(1, 2))
	src, dst := rng.Perm(pages), rng.Perm(pages)
	runs, err := cp.Coalesce(src, dst)
	require.NoError(tb, err)
	return l, &plan.Dest{Peer: "d", Runs: runs, Route: p.Route()}, bases, keys
}

var buildCases = []struct {
	name     string
	pre, dec reshard.Side
	reshard  bool
}{
	{"same-tp-no-sharding", llama70b(8, reshard.TokenMajor), llama70b(8, reshard.TokenMajor), false},
	{"tp8-16-head-major", llama70b(8, reshard.HeadMajor), llama70b(16, reshard.HeadMajor), true},
	{"tp4-8-head-major", llama70b(4, reshard.HeadMajor), llama70b(8, reshard.HeadMajor), true},
	{"tp8-8-sharded", llama70b(8, reshard.TokenMajor), llama70b(8, reshard.TokenMajor), true},
}

// BenchmarkBuildGroupWrites builds one 8-layer group's writes (16 buffers)
// of a 100k-token chunk on scattered pages (page 64: 1563 runs) toward one
// decode rank, into reused slices, as a submitter does per Work: without a
// sharding (cp.AppendBlocks) and through reshard routes.
func BenchmarkBuildGroupWrites(b *testing.B) {
	for _, tc := range buildCases {
		b.Run(tc.name, func(b *testing.B) {
			var dec *reshard.Side
			if tc.reshard {
				dec = &tc.dec
			}
			l, dest, bases, keys := buildFixture(b, &tc.pre, dec)
			group := l.GroupBuffers(0)
			blocks, ws := buildWrites(nil, nil, l, group, dest, bases, keys)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				blocks, ws = buildWrites(blocks, ws[:0], l, group, dest, bases, keys)
			}
			b.ReportMetric(float64(len(ws)), "writes/op")
		})
	}
}

// TestBuildWritesAllocatesNothing: once the slices grew, building a group's
// writes allocates nothing, with or without a route; and a route builds what
// reshard says it would, into the decode buffer of the same layer and kind.
func TestBuildWritesAllocatesNothing(t *testing.T) {
	for _, tc := range buildCases {
		t.Run(tc.name, func(t *testing.T) {
			var dec *reshard.Side
			if tc.reshard {
				dec = &tc.dec
			}
			l, dest, bases, keys := buildFixture(t, &tc.pre, dec)
			group := l.GroupBuffers(3)
			blocks, ws := buildWrites(nil, nil, l, group, dest, bases, keys)
			allocs := testing.AllocsPerRun(5, func() {
				blocks, ws = buildWrites(blocks, ws[:0], l, group, dest, bases, keys)
			})
			require.Zero(t, allocs)
			per := len(dest.Runs)
			if dest.Route != nil {
				per = dest.Route.Blocks(dest.Runs)
			}
			require.Len(t, ws, len(group)*per)
			in := map[int]bool{}
			for _, b := range group {
				in[b] = true
			}
			for _, w := range ws {
				// Decode buffer i starts at (i+1) << 40; both sides list K0..K79, V0..V79.
				require.True(t, in[int(w.Dst>>40)-1], "write %+v lands outside group 3's layers", w)
			}
		})
	}
}
