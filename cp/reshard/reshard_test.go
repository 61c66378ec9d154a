package reshard

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gqa is a small GQA model: 8 KV heads of 4 bytes, 6 layers, pages of 4.
func gqa(tp int, order Order) Side {
	return Side{Layers: 6, KVHeads: 8, HeadDim: 2, ElemBytes: 2, TP: tp, PageSize: 4, Order: order}
}

func mla(tp int) Side {
	return Side{Layers: 6, KVHeads: 1, HeadDim: 9, ElemBytes: 1, MLA: true, TP: tp, PageSize: 4}
}

func TestPairingErrorsNameTheValues(t *testing.T) {
	with := func(f func(p *Pairing)) Pairing {
		p := Pairing{Prefill: gqa(4, TokenMajor), Decode: gqa(8, TokenMajor)}
		f(&p)
		return p
	}
	for _, tc := range []struct {
		name string
		p    Pairing
		err  string
	}{
		{"heads do not split", with(func(p *Pairing) { p.Prefill.TP = 3 }), "prefill: 8 KV heads do not split over TP 3"},
		{"TP not a multiple of heads", with(func(p *Pairing) { p.Decode.TP = 12 }), "decode: TP 12 is not a multiple of the 8 KV heads it replicates"},
		{"head dims differ", with(func(p *Pairing) { p.Decode.HeadDim = 4 }), "prefill head dim 2, decode 4"},
		{"dtypes differ", with(func(p *Pairing) { p.Decode.ElemBytes = 1 }), "prefill dtype of 2 bytes, decode 1 bytes"},
		{"layer counts differ", with(func(p *Pairing) { p.Decode.Layers = 7 }), "prefill has 6 layers, decode 7"},
		{"head counts differ", with(func(p *Pairing) { p.Decode.KVHeads = 16 }), "prefill has 8 KV heads, decode 16"},
		{"page sizes differ", with(func(p *Pairing) { p.Decode.PageSize = 16 }), "prefill page size 4, decode 16"},
		{"MLA against GQA", Pairing{Prefill: mla(2), Decode: gqa(2, TokenMajor)}, "prefill MLA true, decode MLA false"},
		{"MLA with heads", with(func(p *Pairing) { p.Prefill.MLA = true }), "prefill: MLA with 8 KV heads"},
		{"heads per rank", with(func(p *Pairing) { p.Prefill.HeadsPerRank = 4 }), "prefill: 4 KV heads per rank, but 8 KV heads over TP 4 give 2"},
		{"stages miss layers", with(func(p *Pairing) { p.Decode.Stages = []int{0, 3, 5} }), "decode: PP stages span layers [0, 5), the model has [0, 6)"},
		{"empty stage", with(func(p *Pairing) { p.Prefill.Stages = []int{0, 3, 3, 6} }), "prefill: PP stage 1 holds layers [3, 3): empty"},
		// More boundaries than the layers can hold once said "need at least 2".
		{"more stages than layers", with(func(p *Pairing) { p.Prefill.Stages = make([]int, 100001) }),
			"prefill: 100001 PP stage boundaries (100000 stages) for 6 layers: want 2 to 7"},
		{"one boundary", with(func(p *Pairing) { p.Decode.Stages = []int{0} }), "decode: 1 PP stage boundaries (0 stages) for 6 layers: want 2 to 7"},
		{"zero TP", with(func(p *Pairing) { p.Decode.TP = 0 }), "decode: TP 0"},
		{"zero page size", with(func(p *Pairing) { p.Prefill.PageSize = 0 }), "prefill: page size 0"},
		{"unknown order", with(func(p *Pairing) { p.Decode.Order = 5 }), "decode: page order 5"},
		{"unknown rule", with(func(p *Pairing) { p.Replicas = 9 }), "replica rule 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPlan(&tc.p, Rank{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
			assert.True(t, errors.Is(err, ErrBadInput))
		})
	}
	p := with(func(*Pairing) {})
	_, err := NewPlan(&p, Rank{TP: 4})
	require.ErrorContains(t, err, "prefill: TP rank 4: must be in [0, 4)")
	_, err = NewPlan(&p, Rank{Stage: 1})
	require.ErrorContains(t, err, "prefill: PP stage 1: must be in [0, 1)")
}

// sending lists the decode ranks a plan sends to.
func sending(p *Plan) []Rank {
	var out []Rank
	for _, r := range p.Routes {
		if !r.Empty() {
			out = append(out, r.Dest)
		}
	}
	return out
}

func TestGQAReplicasSendOnce(t *testing.T) {
	// Llama-70B's 8 KV heads, TP 8 -> 16: decode ranks 2h and 2h+1 both hold
	// head h, and prefill rank h (the only holder) sends it to both, whole.
	p := Pairing{Prefill: gqa(8, TokenMajor), Decode: gqa(16, TokenMajor)}
	plan, err := NewPlan(&p, Rank{TP: 3})
	require.NoError(t, err)
	assert.Equal(t, []Rank{{TP: 6}, {TP: 7}}, sending(plan))
	r := plan.Route(Rank{TP: 7})
	assert.True(t, r.Whole)
	assert.Equal(t, [2]int{3, 4}, [2]int{r.HeadLo, r.HeadHi})
	assert.Equal(t, uint64(4*1*4), r.SrcItem)

	// TP 16 -> 8: prefill ranks 2h and 2h+1 both hold head h; decode rank h
	// needs it once. Spread picks replica h % 2.
	p = Pairing{Prefill: gqa(16, TokenMajor), Decode: gqa(8, TokenMajor)}
	for src := 0; src < 16; src++ {
		plan, err := NewPlan(&p, Rank{TP: src})
		require.NoError(t, err)
		h := src / 2
		if h%2 == src%2 {
			assert.Equal(t, []Rank{{TP: h}}, sending(plan), "prefill rank %d", src)
		} else {
			assert.Empty(t, sending(plan), "prefill rank %d", src)
		}
	}
	// Same TP with replicas: rank to rank.
	p = Pairing{Prefill: gqa(16, TokenMajor), Decode: gqa(16, HeadMajor)}
	plan, err = NewPlan(&p, Rank{TP: 5})
	require.NoError(t, err)
	assert.Equal(t, []Rank{{TP: 5}}, sending(plan))
	p.Replicas = FirstReplica
	plan, err = NewPlan(&p, Rank{TP: 4})
	require.NoError(t, err)
	assert.Equal(t, []Rank{{TP: 4}, {TP: 5}}, sending(plan), "replica 0 sends both copies")
	plan, err = NewPlan(&p, Rank{TP: 5})
	require.NoError(t, err)
	assert.Empty(t, sending(plan))
}

func TestMLALatentOneSenderPerDestination(t *testing.T) {
	p := Pairing{Prefill: mla(8), Decode: mla(16)}
	senders := make([]int, 16)
	for src := 0; src < 8; src++ {
		plan, err := NewPlan(&p, Rank{TP: src})
		require.NoError(t, err)
		assert.Equal(t, []Rank{{TP: src}, {TP: src + 8}}, sending(plan))
		for _, d := range sending(plan) {
			senders[d.TP]++
			assert.True(t, plan.Route(d).Whole)
		}
	}
	for d, n := range senders {
		assert.Equal(t, 1, n, "decode rank %d", d)
	}
	p.Replicas = FirstReplica
	plan, err := NewPlan(&p, Rank{TP: 0})
	require.NoError(t, err)
	assert.Len(t, sending(plan), 16)
	r := plan.Route(Rank{TP: 3})
	src, ok := r.DstBuffer(5)
	assert.True(t, ok)
	assert.Equal(t, 5, src, "one latent buffer per layer")
}

func TestHeadSlicePieces(t *testing.T) {
	const hb = 4 // bytes of one head of one token
	for _, tc := range []struct {
		name     string
		pre, dec Side
		src, dst int
		want     []Piece
	}{
		{"2->4 token-major: a slice per token", gqa(2, TokenMajor), gqa(4, TokenMajor), 0, 1,
			[]Piece{{Src: 2 * hb, Dst: 0, Len: 2 * hb, Count: 4, SrcStride: 4 * hb, DstStride: 2 * hb}}},
		{"2->4 head-major: one piece per page", gqa(2, HeadMajor), gqa(4, HeadMajor), 0, 1,
			[]Piece{{Src: 2 * 4 * hb, Dst: 0, Len: 2 * 4 * hb, Count: 1}}},
		{"4->2 token-major: into the middle of each token", gqa(4, TokenMajor), gqa(2, TokenMajor), 1, 0,
			[]Piece{{Src: 0, Dst: 2 * hb, Len: 2 * hb, Count: 4, SrcStride: 2 * hb, DstStride: 4 * hb}}},
		{"2->4 token-major to head-major: a strided piece per head", gqa(2, TokenMajor), gqa(4, HeadMajor), 0, 1,
			[]Piece{
				{Src: 2 * hb, Dst: 0, Len: hb, Count: 4, SrcStride: 4 * hb, DstStride: hb},
				{Src: 3 * hb, Dst: 4 * hb, Len: hb, Count: 4, SrcStride: 4 * hb, DstStride: hb},
			}},
		{"8->16 one head to head-major: whole page", gqa(8, TokenMajor), gqa(16, HeadMajor), 2, 5,
			[]Piece{{Src: 0, Dst: 0, Len: 4 * hb, Count: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Pairing{Prefill: tc.pre, Decode: tc.dec}
			plan, err := NewPlan(&p, Rank{TP: tc.src})
			require.NoError(t, err)
			r := plan.Route(Rank{TP: tc.dst})
			require.False(t, r.Empty())
			assert.Equal(t, tc.want, r.Pieces)
			whole := r.SrcItem == r.DstItem && len(tc.want) == 1 && tc.want[0].Len == r.SrcItem
			assert.Equal(t, whole, r.Whole)
		})
	}
}

func TestPPLayersIntersect(t *testing.T) {
	p := Pairing{Prefill: gqa(2, TokenMajor), Decode: gqa(2, TokenMajor)}
	p.Prefill.Stages = []int{0, 3, 6}
	p.Decode.Stages = []int{0, 2, 4, 6}
	plan, err := NewPlan(&p, Rank{TP: 1, Stage: 1}) // layers [3, 6)
	require.NoError(t, err)
	assert.Equal(t, []Rank{{TP: 1, Stage: 1}, {TP: 1, Stage: 2}}, sending(plan))
	r1, r2 := plan.Route(Rank{TP: 1, Stage: 1}), plan.Route(Rank{TP: 1, Stage: 2})
	assert.Equal(t, [2]int{3, 4}, [2]int{r1.LayerLo, r1.LayerHi})
	assert.Equal(t, [2]int{4, 6}, [2]int{r2.LayerLo, r2.LayerHi})
	// Prefill buffer 3 is layer 4's V (stage 1 starts at layer 3): decode
	// stage 2's buffer 1; it does not go to stage 1.
	_, ok := r1.DstBuffer(3)
	assert.False(t, ok)
	d, ok := r2.DstBuffer(3)
	require.True(t, ok)
	assert.Equal(t, 1, d)
	d, ok = r1.DstBuffer(1) // layer 3's V: decode stage 1 starts at layer 2
	require.True(t, ok)
	assert.Equal(t, 3, d)
	for _, b := range []int{-1, 6, 100} {
		_, ok := r2.DstBuffer(b)
		assert.False(t, ok, "buffer %d", b)
	}
}

func TestAppendBlocks(t *testing.T) {
	runs := []cp.Run{{Src: 2, Dst: 5, Len: 2}, {Src: 9, Dst: 0, Len: 1}}
	p := Pairing{Prefill: gqa(8, TokenMajor), Decode: gqa(16, TokenMajor)}
	plan, err := NewPlan(&p, Rank{TP: 0})
	require.NoError(t, err)
	whole := plan.Route(Rank{TP: 1})
	require.True(t, whole.Whole)
	got := whole.AppendBlocks(nil, runs, 1000, 5000)
	assert.Equal(t, cp.AppendBlocks(nil, runs, 1000, 5000, 16), got, "a whole-page route is a page copy")
	assert.Equal(t, len(got), whole.Blocks(runs))

	p = Pairing{Prefill: gqa(2, TokenMajor), Decode: gqa(4, TokenMajor)}
	plan, err = NewPlan(&p, Rank{TP: 0})
	require.NoError(t, err)
	r := plan.Route(Rank{TP: 1}) // src item 64 (4 heads), dst item 32 (2 heads)
	got = r.AppendBlocks(nil, runs[:1], 1000, 5000)
	require.Len(t, got, 8)
	assert.Equal(t, 8, r.Blocks(runs[:1]))
	assert.Equal(t, cp.Block{Src: 1000 + 2*64 + 8, Dst: 5000 + 5*32, Len: 8}, got[0])
	assert.Equal(t, cp.Block{Src: 1000 + 2*64 + 8 + 16, Dst: 5000 + 5*32 + 8, Len: 8}, got[1])
	assert.Equal(t, cp.Block{Src: 1000 + 3*64 + 8, Dst: 5000 + 6*32, Len: 8}, got[4], "next page")

	buf := make([]cp.Block, 0, 64)
	allocs := testing.AllocsPerRun(100, func() {
		buf = r.AppendBlocks(buf[:0], runs, 1000, 5000)
		buf = whole.AppendBlocks(buf, runs, 1000, 5000)
	})
	assert.Zero(t, allocs, "the per-group path allocates nothing into a reused slice")

	assert.Nil(t, plan.Route(Rank{TP: 4}))
	assert.Nil(t, plan.Route(Rank{Stage: 1}))
	assert.Nil(t, plan.Route(Rank{TP: -1, Stage: 1}))

	var empty Route
	assert.True(t, empty.Empty())
	assert.Empty(t, empty.AppendBlocks(nil, runs, 0, 0))
	_, ok := empty.DstBuffer(0)
	assert.False(t, ok)
}

func TestPageJoinAcrossOrders(t *testing.T) {
	// Every head on both sides, token-major into head-major: each page is
	// one strided piece per head, but its last write (the last token of the
	// last head) ends both pages and the next page's first write starts
	// both, so consecutive pages share a write.
	pre, dec := gqa(1, TokenMajor), gqa(1, HeadMajor)
	pre.KVHeads, dec.KVHeads, pre.PageSize, dec.PageSize = 2, 2, 2, 2
	p := Pairing{Prefill: pre, Decode: dec}
	plan, err := NewPlan(&p, Rank{})
	require.NoError(t, err)
	r := plan.Route(Rank{})
	require.False(t, r.Whole)
	require.True(t, r.PageJoin)
	runs := []cp.Run{{Src: 0, Dst: 0, Len: 2}, {Src: 5, Dst: 9, Len: 1}}
	got := r.AppendBlocks(nil, runs, 0, 0)
	const hb = 4
	assert.Equal(t, []cp.Block{
		{Src: 0, Dst: 0, Len: hb}, {Src: 2 * hb, Dst: hb, Len: hb}, // head 0, tokens 0 and 1
		{Src: hb, Dst: 2 * hb, Len: hb}, {Src: 3 * hb, Dst: 3 * hb, Len: 2 * hb}, // head 1 token 1 + page 1 head 0 token 0
		{Src: 6 * hb, Dst: 5 * hb, Len: hb}, {Src: 5 * hb, Dst: 6 * hb, Len: hb}, {Src: 7 * hb, Dst: 7 * hb, Len: hb},
		{Src: 20 * hb, Dst: 36 * hb, Len: hb}, {Src: 22 * hb, Dst: 37 * hb, Len: hb}, // the next run starts afresh
		{Src: 21 * hb, Dst: 38 * hb, Len: hb}, {Src: 23 * hb, Dst: 39 * hb, Len: hb},
	}, got)
	assert.Equal(t, len(got), r.Blocks(runs))
}
