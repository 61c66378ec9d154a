package tinylm

import (
	"math"
)

// Layer computes layer l for a block of consecutive tokens, updating their
// hidden states h in place. The tokens occupy cache slots first ..
// first+len(h)-1 and are rotated at RoPE positions rope (a serving stack
// passes positions and cache slots separately; normally rope[i] is
// first+i). ranks are the TP ranks of the PP stage that holds l, in rank
// order.
//
// The block's KV is written into every rank's cache first (each rank its
// own heads; a replicated head, or MLA's latent, by every rank that holds
// it), then each rank attends, for its query heads, over slots [0, slot]
// reading the KV back from its own cache, and projects its heads' outputs
// through its columns of the output projection; the ranks' partial outputs
// are summed in rank order, as a TP all-reduce does. The SwiGLU is split
// the same way over the ranks.
func (m *Model) Layer(l int, h [][]float64, first int, rope []int, ranks []*Cache) error {
	if err := m.checkLayer(l, h, first, rope, ranks); err != nil {
		return err
	}
	w := &m.layers[l]
	n, d := len(h), m.cfg.Hidden
	xs := make([][]float64, n)
	for i := range h {
		xs[i] = rmsNorm(h[i], w.attnNorm)
	}
	attn := make([][]float64, n)
	for i := range attn {
		attn[i] = make([]float64, d)
	}
	for r, c := range ranks {
		if m.cfg.Arch == MLA {
			m.mlaRank(w, l, r, len(ranks), c, xs, first, rope, attn)
		} else {
			m.gqaRank(w, l, r, len(ranks), c, xs, first, rope, attn)
		}
	}
	for i := range h {
		for j := range h[i] {
			h[i][j] += attn[i][j]
		}
	}
	m.mlp(w, h, len(ranks))
	return nil
}

func (m *Model) checkLayer(l int, h [][]float64, first int, rope []int, ranks []*Cache) error {
	switch {
	case l < 0 || l >= m.cfg.Layers():
		return badInput("layer %d: the model has %d", l, m.cfg.Layers())
	case len(rope) != len(h):
		return badInput("layer %d: %d RoPE positions for %d tokens", l, len(rope), len(h))
	case first < 0:
		return badInput("layer %d: first slot %d", l, first)
	case len(ranks) == 0:
		return badInput("layer %d: no rank", l)
	}
	for i, x := range h {
		if len(x) != m.cfg.Hidden {
			return badInput("layer %d: hidden state %d has %d values, the model %d", l, i, len(x), m.cfg.Hidden)
		}
	}
	s := &ranks[0].Side
	if err := m.cfg.CheckSide(s); err != nil {
		return err
	}
	st := ranks[0].Rank.Stage
	if lo, hi := s.StageLayers(st); l < lo || l >= hi {
		return badInput("layer %d: PP stage %d holds layers [%d, %d)", l, st, lo, hi)
	}
	if len(ranks) != s.TP {
		return badInput("layer %d: %d ranks, the side has TP %d", l, len(ranks), s.TP)
	}
	for r, c := range ranks {
		switch {
		case c.Rank.TP != r || c.Rank.Stage != st:
			return badInput("layer %d: cache %d is TP rank %d of stage %d, want rank %d of stage %d", l, r, c.Rank.TP, c.Rank.Stage, r, st)
		case c.Side.TP != s.TP || c.Side.PageSize != s.PageSize || c.Side.Order != s.Order || len(c.Side.Stages) != len(s.Stages):
			return badInput("layer %d: TP rank %d's side differs from rank 0's", l, r)
		case first+len(h) > c.Capacity():
			return badInput("layer %d: slots up to %d, TP rank %d's cache holds %d tokens (%d pages)", l, first+len(h), r, c.Capacity(), len(c.Pages))
		}
		for i, ref := range c.Pages {
			if ref.Pool == nil {
				return badInput("layer %d: TP rank %d: request page %d has no pool", l, r, i)
			}
		}
	}
	return nil
}

// gqaRank is TP rank r's share of a GQA layer: its KV heads' K and V for
// the block, then its query heads' attention, added into out.
func (m *Model) gqaRank(w *layer, l, r, tp int, c *Cache, xs [][]float64, first int, rope []int, out [][]float64) {
	cfg := &m.cfg
	D, n := cfg.HeadDim, len(xs)
	qpr, group := cfg.QHeads/tp, cfg.QHeads/cfg.KVHeads
	klo, khi := c.Side.RankHeads(r)
	k, v := make([]float64, D), make([]float64, D)
	for i, x := range xs {
		for kh := klo; kh < khi; kh++ {
			matVecRows(k, w.wk, kh*D, x)
			m.rope(k, rope[i])
			c.write(l, KindK, kh, first+i, k)
			matVecRows(v, w.wv, kh*D, x)
			c.write(l, KindV, kh, first+i, v)
		}
	}
	end := first + n
	ks, vs := make([][]float64, end), make([][]float64, end)
	for t := range ks {
		ks[t], vs[t] = make([]float64, D), make([]float64, D)
	}
	q, o := make([]float64, D), make([]float64, D)
	scores := make([]float64, end)
	scale := 1 / math.Sqrt(float64(D))
	part := rankPartials(n, cfg.Hidden)
	for kh := klo; kh < khi; kh++ {
		// Every slot's K and V of this head, read back from the pages.
		for t := 0; t < end; t++ {
			c.read(l, KindK, kh, t, ks[t])
			c.read(l, KindV, kh, t, vs[t])
		}
		for qh := max(kh*group, r*qpr); qh < min((kh+1)*group, (r+1)*qpr); qh++ {
			for i, x := range xs {
				matVecRows(q, w.wq, qh*D, x)
				m.rope(q, rope[i])
				sc := scores[:first+i+1]
				for t := range sc {
					sc[t] = dot(q, ks[t]) * scale
				}
				softmaxInPlace(sc)
				clear(o)
				for t, p := range sc {
					axpy(o, p, vs[t])
				}
				addMatVecCols(part[i], w.wo, cfg.QHeads*D, qh*D, o)
			}
		}
	}
	for i := range out {
		add(out[i], part[i]) // the all-reduce, in rank order
	}
}

// mlaRank is TP rank r's share of an MLA layer: the block's latents (every
// rank holds all of them), then its query heads' attention in the latent
// space (the key and value up-projections absorbed into the query and the
// output), added into out.
func (m *Model) mlaRank(w *layer, l, r, tp int, c *Cache, xs [][]float64, first int, rope []int, out [][]float64) {
	cfg := &m.cfg
	L, R, N, V, n := cfg.LatentDim, cfg.RoPEDim, cfg.NoPEDim, cfg.VDim, len(xs)
	lat := make([]float64, L)
	entry := make([]float64, L+R)
	for i, x := range xs {
		matVec(lat, w.wdkv, x)
		copy(entry, rmsNorm(lat, w.kvNorm))
		matVec(entry[L:], w.wkr, x)
		m.rope(entry[L:], rope[i])
		c.write(l, 0, 0, first+i, entry)
	}
	end := first + n
	kv := make([][]float64, end)
	for t := range kv {
		kv[t] = make([]float64, L+R)
		c.read(l, 0, 0, t, kv[t])
	}
	qpr := cfg.QHeads / tp
	qf, qc, ol, o := make([]float64, N+R), make([]float64, L), make([]float64, L), make([]float64, V)
	scores := make([]float64, end)
	scale := 1 / math.Sqrt(float64(N+R))
	part := rankPartials(n, cfg.Hidden)
	for qh := r * qpr; qh < (r+1)*qpr; qh++ {
		for i, x := range xs {
			matVecRows(qf, w.wqm, qh*(N+R), x)
			qn, qr := qf[:N], qf[N:]
			m.rope(qr, rope[i])
			// qc = Wuk_h^T qn: the key up-projection absorbed.
			clear(qc)
			for a, qa := range qn {
				axpy(qc, qa, w.wuk[(qh*N+a)*L:(qh*N+a+1)*L])
			}
			sc := scores[:first+i+1]
			for t := range sc {
				sc[t] = (dot(qc, kv[t][:L]) + dot(qr, kv[t][L:])) * scale
			}
			softmaxInPlace(sc)
			clear(ol)
			for t, p := range sc {
				axpy(ol, p, kv[t][:L])
			}
			matVecRows(o, w.wuv, qh*V, ol)
			addMatVecCols(part[i], w.wo, cfg.QHeads*V, qh*V, o)
		}
	}
	for i := range out {
		add(out[i], part[i]) // the all-reduce, in rank order
	}
}

// rankPartials is one rank's partial outputs for a block: n zero rows.
func rankPartials(n, d int) [][]float64 {
	part := make([][]float64, n)
	for i := range part {
		part[i] = make([]float64, d)
	}
	return part
}

// mlp adds the SwiGLU block to h, its width split over tp ranks whose
// partial outputs are summed in rank order.
func (m *Model) mlp(w *layer, h [][]float64, tp int) {
	d, I := m.cfg.Hidden, m.cfg.Inter
	per := I / tp
	g, u := make([]float64, per), make([]float64, per)
	sum, partial := make([]float64, d), make([]float64, d)
	for _, x := range h {
		xn := rmsNorm(x, w.mlpNorm)
		clear(sum)
		for r := 0; r < tp; r++ {
			matVecRows(g, w.gate, r*per, xn)
			matVecRows(u, w.up, r*per, xn)
			for j := range g {
				g[j] = silu(g[j]) * u[j]
			}
			clear(partial)
			addMatVecCols(partial, w.down, I, r*per, g)
			add(sum, partial)
		}
		add(x, sum)
	}
}

func dot(a, b []float64) float64 {
	var s float64
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// axpy adds a*x to y.
func axpy(y []float64, a float64, x []float64) {
	for i, v := range x {
		y[i] += a * v
	}
}

func add(y, x []float64) {
	for i, v := range x {
		y[i] += v
	}
}
