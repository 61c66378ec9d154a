package tinylm

import (
	"math"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const promptLen, newTokens = 24, 6

// side builds a side's caches over fresh pools: pools[stage][tp], pages
// given by the page table (scattered when pages is).
func sideCaches(t *testing.T, m *Model, tp, pp, pageSize int, order reshard.Order, pages []int) [][]*Cache {
	t.Helper()
	c := m.Config()
	var stages []int
	if pp > 1 {
		for s := 0; s <= pp; s++ {
			stages = append(stages, s*c.Layers()/pp)
		}
	}
	side := c.Side(tp, stages, pageSize, order)
	poolPages := 0
	for _, p := range pages {
		poolPages = max(poolPages, p+1)
	}
	var pools [][]Pool
	for st := 0; st < side.PP(); st++ {
		lo, hi := side.StageLayers(st)
		var ranks []Pool
		for r := 0; r < tp; r++ {
			ranks = append(ranks, NewMemPool((hi-lo)*side.Kinds(), int(side.ItemLen()), poolPages))
		}
		pools = append(pools, ranks)
	}
	caches, err := NewCaches(side, pools, pages)
	require.NoError(t, err)
	return caches
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// scattered is a page table that is not the identity: pages in reverse,
// every other one skipped.
func scattered(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 2 * (n - 1 - i)
	}
	return out
}

// prefill runs the prompt in chunks of chunk tokens through a side.
func prefill(t *testing.T, m *Model, caches [][]*Cache, prompt []int, chunk int) Step {
	t.Helper()
	var h []float64
	for a := 0; a < len(prompt); a += chunk {
		b := min(a+chunk, len(prompt))
		var err error
		h, err = m.Forward(caches, prompt[a:b], a, nil)
		require.NoError(t, err)
	}
	return Pick(m.Logits(h))
}

func models(t *testing.T) []*Model {
	var out []*Model
	for _, n := range PresetNames() {
		m, err := New(Presets[n])
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

// TestArrangementsGenerateTheModelsTokens: chunked prefill, TP (head
// slicing and replicas), PP, both page orders and scattered page tables
// all generate the model's own tokens. The arrangements that sum in the
// model's order (TP 1) are bit-identical; other TP degrees sum the ranks'
// partial outputs in another order, and their logits differ, within the
// tolerance.
func TestArrangementsGenerateTheModelsTokens(t *testing.T) {
	for _, m := range models(t) {
		prompt := m.Prompt(7, promptLen)
		wantFirst, want, err := m.Reference(prompt, newTokens)
		require.NoError(t, err)
		for _, a := range []struct {
			tp, pp, page, chunk int
			order               reshard.Order
			exact               bool
		}{
			{tp: 1, pp: 1, page: 4, chunk: 8, order: reshard.TokenMajor, exact: true},
			{tp: 1, pp: 2, page: 5, chunk: 7, order: reshard.HeadMajor, exact: true},
			{tp: 2, pp: 1, page: 4, chunk: 24, order: reshard.HeadMajor},
			{tp: 4, pp: 2, page: 3, chunk: 5, order: reshard.TokenMajor},
			{tp: 8, pp: 1, page: 8, chunk: 8, order: reshard.HeadMajor}, // GQA: two replicas of each KV head
		} {
			pages := scattered((promptLen + newTokens + a.page - 1) / a.page)
			caches := sideCaches(t, m, a.tp, a.pp, a.page, a.order, pages)
			first := prefill(t, m, caches, prompt, a.chunk)
			got, err := m.Generate(caches, promptLen, first.Token, newTokens)
			require.NoError(t, err)
			c := Compare(&got, &want)
			name := m.Config().Name
			assert.Equal(t, wantFirst.Token, first.Token, "%s %+v", name, a)
			assert.True(t, c.Equal, "%s %+v: %v, want %v", name, a, got.Tokens(), want.Tokens())
			if a.exact {
				assert.Zero(t, c.MaxLogitDiff, "%s %+v: the model's summation order, the same bits", name, a)
				assert.Zero(t, math.Abs(first.Margin-wantFirst.Margin), "%s %+v", name, a)
			} else {
				assert.Positive(t, c.MaxLogitDiff, "%s %+v: TP ranks' partial sums must combine as TP does, not in the model's order", name, a)
				assert.LessOrEqual(t, c.MaxLogitDiff, LogitTolerance, "%s %+v", name, a)
			}
		}
	}
}

// TestMarginsAreClear: the presets' greedy picks are far from ties on
// several prompts, so that equal tokens are not luck.
func TestMarginsAreClear(t *testing.T) {
	for _, m := range models(t) {
		for seed := uint64(1); seed <= 3; seed++ {
			first, g, err := m.Reference(m.Prompt(seed, promptLen), 8)
			require.NoError(t, err)
			assert.Greater(t, min(first.Margin, g.MinMargin()), 10*LogitTolerance, "%s seed %d", m.Config().Name, seed)
		}
	}
}

// TestDecodeReadsOnlyThePages: the decode's tokens depend on the KV in the
// request's pages (one page of another prompt's KV changes them) and on
// nothing outside them (a page the table does not list is never read).
func TestDecodeReadsOnlyThePages(t *testing.T) {
	for _, m := range models(t) {
		prompt, other := m.Prompt(3, promptLen), m.Prompt(4, promptLen)
		_, want, err := m.Reference(prompt, newTokens)
		require.NoError(t, err)
		pages := scattered(8) // pages 14, 12, ..., 0: the odd pages are not the request's
		caches := sideCaches(t, m, 1, 1, 4, reshard.HeadMajor, pages)
		first := prefill(t, m, caches, prompt, 8)
		others := sideCaches(t, m, 1, 1, 4, reshard.HeadMajor, pages)
		prefill(t, m, others, other, 8)
		side := &caches[0][0].Side
		pool, otherPool := caches[0][0].Pages[0].Pool, others[0][0].Pages[0].Pool
		for b := 0; b < side.Layers*side.Kinds(); b++ {
			for pg := 1; pg < 15; pg += 2 {
				fill := pool.Page(b, pg)
				for i := range fill {
					fill[i] = 0xEE // a huge float32: read, it would wreck the logits
				}
			}
		}
		got, err := m.Generate(cloneCaches(caches), promptLen, first.Token, newTokens)
		require.NoError(t, err)
		assert.True(t, Compare(&got, &want).Equal, "%s: pages outside the table were read", m.Config().Name)

		for b := 0; b < side.Layers*side.Kinds(); b++ {
			copy(pool.Page(b, pages[2]), otherPool.Page(b, pages[2])) // request page 2: another prompt's
		}
		got, err = m.Generate(caches, promptLen, first.Token, newTokens)
		require.NoError(t, err)
		assert.False(t, Compare(&got, &want).Equal, "%s: one page of another prompt's KV changed no token", m.Config().Name)
	}
}

// cloneCaches copies the pools behind caches, so that a decode (which
// writes its tokens' KV) leaves the originals untouched.
func cloneCaches(caches [][]*Cache) [][]*Cache {
	clones := map[Pool]Pool{}
	out := make([][]*Cache, len(caches))
	for st, ranks := range caches {
		for _, c := range ranks {
			cc := *c
			cc.Pages = make([]PageRef, len(c.Pages))
			for i, ref := range c.Pages {
				if clones[ref.Pool] == nil {
					mp := ref.Pool.(*MemPool)
					cl := &MemPool{itemLen: mp.itemLen}
					for _, b := range mp.bufs {
						cl.bufs = append(cl.bufs, slices.Clone(b))
					}
					clones[ref.Pool] = cl
				}
				cc.Pages[i] = PageRef{Pool: clones[ref.Pool], Page: ref.Page}
			}
			out[st] = append(out[st], &cc)
		}
	}
	return out
}

// TestEveryLayerDecides: zeroing any one layer's KV of the prompt changes
// the tokens, the MLA model's extra layer (the one without a hook)
// included: it is on the token path.
func TestEveryLayerDecides(t *testing.T) {
	for _, m := range models(t) {
		prompt := m.Prompt(5, 16)
		_, want, err := m.Reference(prompt, 4)
		require.NoError(t, err)
		for l := 0; l < m.Config().Layers(); l++ {
			caches := sideCaches(t, m, 1, 1, 4, reshard.TokenMajor, seq(5))
			first := prefill(t, m, caches, prompt, 16)
			side := &caches[0][0].Side
			for kind := 0; kind < side.Kinds(); kind++ {
				for pg := 0; pg < 4; pg++ {
					clear(caches[0][0].Pages[pg].Pool.Page(Buffer(side, 0, l, kind), pg))
				}
			}
			got, err := m.Generate(caches, 16, first.Token, 4)
			require.NoError(t, err)
			assert.False(t, Compare(&got, &want).Equal, "%s: layer %d's KV decides no token", m.Config().Name, l)
		}
	}
}

// TestCheck is the decode side's verdict: OK on the KV a correct prefill
// wrote, not on a wrong first token or a wrong page.
func TestCheck(t *testing.T) {
	m, err := New(Presets["tiny-gqa"])
	require.NoError(t, err)
	prompt := m.Prompt(9, promptLen)
	caches := sideCaches(t, m, 2, 1, 4, reshard.HeadMajor, scattered(8))
	first := prefill(t, m, caches, prompt, 8)
	v, err := m.Check(cloneCaches(caches), prompt, first.Token, newTokens)
	require.NoError(t, err)
	assert.True(t, v.OK(), "%+v", v)
	assert.Equal(t, v.Reference, v.Tokens)
	assert.Greater(t, v.MinMargin, LogitTolerance)
	// The expectation computed beforehand gives the same verdict.
	e, err := m.Expect(prompt, newTokens)
	require.NoError(t, err)
	assert.Equal(t, len(prompt), e.PromptLen)
	assert.Equal(t, first.Token, e.First.Token)
	v2, err := m.CheckAgainst(cloneCaches(caches), e, first.Token)
	require.NoError(t, err)
	assert.Equal(t, v, v2)

	v, err = m.Check(cloneCaches(caches), prompt, (first.Token+1)%m.Config().Vocab, newTokens)
	require.NoError(t, err)
	assert.False(t, v.OK(), "a wrong first token passed")
	assert.False(t, v.FirstEqual)

	for b := 0; b < 2*m.Config().Layers(); b++ {
		pg := caches[0][1].Pages[1]
		clear(pg.Pool.Page(b, pg.Page))
	}
	v, err = m.Check(caches, prompt, first.Token, newTokens)
	require.NoError(t, err)
	assert.False(t, v.OK(), "a zeroed page on TP rank 1 passed")
	assert.False(t, v.Equal)
}

func TestPickAndCompare(t *testing.T) {
	s := Pick([]float64{1, 3, 2.5, -1})
	assert.Equal(t, 1, s.Token)
	assert.InDelta(t, 0.5, s.Margin, 1e-12)
	tie := Pick([]float64{2, 2, 1})
	assert.Equal(t, 0, tie.Token, "the lowest index wins a tie")
	assert.Zero(t, tie.Margin)
	assert.Equal(t, 2, Pick([]float64{0, 1, 5}).Token)

	a := Generation{Steps: []Step{{Token: 1, Logits: []float64{0, 1}}, {Token: 0, Logits: []float64{2, 1}}, {Token: 1, Logits: []float64{0, 9}}}}
	b := Generation{Steps: []Step{{Token: 1, Logits: []float64{0, 1.5}}, {Token: 1, Logits: []float64{1, 4}}, {Token: 1, Logits: []float64{0, 0}}}}
	c := Compare(&a, &b)
	assert.False(t, c.Equal)
	assert.Equal(t, 1, c.FirstDiff)
	assert.InDelta(t, 3, c.MaxLogitDiff, 1e-12, "up to the first difference only")
	same := Compare(&a, &a)
	assert.True(t, same.Equal)
	assert.Equal(t, -1, same.FirstDiff)
	assert.Zero(t, same.MaxLogitDiff)
	short := Generation{Steps: a.Steps[:2]}
	c = Compare(&short, &a)
	assert.False(t, c.Equal)
	assert.Equal(t, 2, c.FirstDiff)
}

func TestWeightsFollowTheSeed(t *testing.T) {
	cfg := Presets["tiny-gqa"]
	m1, err := New(cfg)
	require.NoError(t, err)
	m2, err := New(cfg)
	require.NoError(t, err)
	cfg.Seed++
	m3, err := New(cfg)
	require.NoError(t, err)
	prompt := m1.Prompt(1, promptLen)
	_, g1, err := m1.Reference(prompt, newTokens)
	require.NoError(t, err)
	_, g2, err := m2.Reference(prompt, newTokens)
	require.NoError(t, err)
	_, g3, err := m3.Reference(prompt, newTokens)
	require.NoError(t, err)
	assert.Equal(t, g1.Tokens(), g2.Tokens())
	assert.Zero(t, Compare(&g1, &g2).MaxLogitDiff)
	assert.NotEqual(t, g1.Tokens(), g3.Tokens())
}

func TestBadInput(t *testing.T) {
	m, err := New(Presets["tiny-gqa"])
	require.NoError(t, err)
	caches := sideCaches(t, m, 2, 1, 4, reshard.HeadMajor, seq(2))
	h, err := m.Embed([]int{1, 2})
	require.NoError(t, err)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{m.Layer(6, h, 0, []int{0, 1}, caches[0]), "layer 6: the model has 6"},
		{m.Layer(0, h, 0, []int{0}, caches[0]), "1 RoPE positions for 2 tokens"},
		{m.Layer(0, h, 7, []int{7, 8}, caches[0]), "slots up to 9, TP rank 0's cache holds 8 tokens"},
		{m.Layer(0, h, 0, []int{0, 1}, caches[0][:1]), "1 ranks, the side has TP 2"},
		{m.Layer(0, h, 0, []int{0, 1}, []*Cache{caches[0][1], caches[0][0]}), "cache 0 is TP rank 1"},
		{func() error { _, err := m.Embed([]int{512}); return err }(), "token 512 at 0: outside the vocabulary of 512"},
		{func() error {
			s := m.Config().Side(3, nil, 4, reshard.HeadMajor)
			c := m.Config()
			return c.CheckSide(&s)
		}(), "do not split over TP 3"},
		{func() error {
			c := Presets["tiny-mla"]
			s := c.Side(1, nil, 4, reshard.HeadMajor)
			cg := m.Config()
			return cg.CheckSide(&s)
		}(), "the model's KV is 6 layers, 4 heads"},
		{func() error { _, err := Preset("gpt5"); return err }(), `model "gpt5": want one of tiny-gqa, tiny-mla`},
		{func() error { c := Presets["tiny-gqa"]; c.KVHeads = 3; _, err := New(c); return err }(), "8 query heads do not group over 3 KV heads"},
	} {
		require.Error(t, tc.err, tc.want)
		assert.Contains(t, tc.err.Error(), tc.want)
		assert.True(t, errors.Is(tc.err, ErrBadInput), "%v", tc.err)
	}
}
