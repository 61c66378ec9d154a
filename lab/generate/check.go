package generate

import (
	"fmt"

	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/cp/reshard/reshardtest"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/tinylm"
)

// restate gives a side to the independent reference, field by field.
func restate(s *reshard.Side) reshardtest.Side {
	return reshardtest.Side{Layers: s.Layers, KVHeads: s.KVHeads, HeadDim: s.HeadDim, ElemBytes: s.ElemBytes, MLA: s.MLA,
		TP: s.TP, Stages: s.Stages, PageSize: s.PageSize, HeadMajor: s.Order == reshard.HeadMajor}
}

// buffer returns the whole of buffer b of a testbed pool.
func buffer(p *testbed.Pool, b int) []byte {
	per := int(p.ItemLen) * p.Pages
	return p.Block.Bytes[b*per : (b+1)*per]
}

// checkBytes compares every byte of the request's pages on every decode
// rank with what the whole-tensor reshard of the prefill pools puts there
// (reshardtest: gathered from each position's owning CP rank, each layer's
// stage and a TP rank holding each head, then re-split the decode side's
// way). It returns the first difference, or "".
func (r *rig) checkBytes(ranks []*rank, dec [][]*testbed.Decode) string {
	g := &r.g
	req := reshardtest.Request{Prefill: restate(&g.pre), Decode: restate(&g.dec), CPSize: r.cfg.CP, CPRule: r.cfg.CPRule,
		Tokens: r.cfg.PromptTokens, SrcPool: g.poolPages, SrcPages: r.src[:g.promptPages], DstPool: g.poolPages}
	for range g.dec.PP() * g.dec.TP {
		req.DstPages = append(req.DstPages, r.dst[:g.promptPages])
	}
	kinds := g.pre.Kinds()
	src := map[reshardtest.Rank]reshardtest.Bufs{}
	for _, rk := range ranks {
		lo, hi := g.pre.StageLayers(rk.st)
		bufs := make(reshardtest.Bufs, (hi-lo)*kinds)
		for l := lo; l < hi; l++ {
			for kind := 0; kind < kinds; kind++ {
				bufs[(l-lo)*kinds+kind] = buffer(rk.pool, tinylm.Buffer(&g.pre, rk.st, l, kind))
			}
		}
		src[reshardtest.Rank{Stage: rk.st, TP: rk.tp, CP: rk.c}] = bufs
	}
	want, mask := req.Reference(src)
	item := int(g.dec.ItemLen())
	for st, pools := range dec {
		lo, hi := g.dec.StageLayers(st)
		for tp, pool := range pools {
			i := st*g.dec.TP + tp
			for l := lo; l < hi; l++ {
				for kind := 0; kind < kinds; kind++ {
					got := buffer(pool.Pool, tinylm.Buffer(&g.dec, st, l, kind))
					w, m := want[i][(l-lo)*kinds+kind], mask[i][(l-lo)*kinds+kind]
					for j := range got {
						if m[j] && got[j] != w[j] {
							return r.describe(st, tp, l, kind, j/item, j%item, got[j], w[j])
						}
					}
				}
			}
		}
	}
	return ""
}

func (r *rig) describe(st, tp, l, kind, page, off int, got, want byte) string {
	pos := -1
	for p, d := range r.dst[:r.g.promptPages] {
		if d == page {
			pos = p
		}
	}
	what := "latent"
	if !r.g.dec.MLA {
		what = [2]string{"K", "V"}[kind]
	}
	return fmt.Sprintf("decode PP stage %d TP rank %d, layer %d %s, request page %d (decode page %d), byte %d of the page: %#02x, want %#02x",
		st, tp, l, what, pos, page, off, got, want)
}
