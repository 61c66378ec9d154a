package reshard

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
)

// FuzzReshard feeds arbitrary layouts to NewPlan: it must return a plan or
// an ErrBadInput error, never panic, and every route of a plan must stay
// within both stages' layers, both ranks' heads and both pages, with writes
// that land inside the buffers.
func FuzzReshard(f *testing.F) {
	// layers, heads, headDim, elemBytes, page, tpP, tpD, ppP, ppD, srcTP, srcStage, flags
	f.Add(80, 8, 128, 2, 64, 8, 16, 1, 1, 3, 0, uint8(0))          // llama70b TP 8 -> 16
	f.Add(80, 8, 128, 2, 16, 16, 8, 1, 1, 5, 0, uint8(1))          // TP 16 -> 8, head-major prefill
	f.Add(61, 1, 576, 2, 64, 8, 16, 1, 1, 7, 0, uint8(4))          // dsv3 MLA
	f.Add(6, 8, 2, 2, 4, 2, 4, 3, 2, 1, 2, uint8(2|8))             // PP 3 -> 2, token- into head-major
	f.Add(6, 8, 2, 2, 4, 3, 4, 1, 1, 0, 0, uint8(0))               // heads do not split
	f.Add(-1, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, uint8(255))          // nonsense
	f.Add(4096, 4096, 1<<20, 1, 1<<16, 1, 1, 1, 1, 0, 0, uint8(1)) // the limits
	f.Fuzz(func(t *testing.T, layers, heads, headDim, elem, page, tpP, tpD, ppP, ppD, srcTP, srcStage int, flags uint8) {
		if tpD > 64 || ppD > 64 || ppP > 64 { // bound the routes, not the values
			return
		}
		side := Side{Layers: layers, KVHeads: heads, HeadDim: headDim, ElemBytes: elem, PageSize: page, MLA: flags&4 != 0}
		pre, dec := side, side
		pre.TP, dec.TP = tpP, tpD
		pre.Order, dec.Order = Order(flags&1), Order(flags>>1&1)
		if flags&16 != 0 {
			dec.Order = Order(flags) // an unknown order
		}
		pre.Stages, dec.Stages = even(layers, ppP), even(layers, ppD)
		p := Pairing{Prefill: pre, Decode: dec, Replicas: ReplicaRule(flags >> 5 & 1)}
		if flags&8 != 0 {
			p.Decode.HeadsPerRank = heads / max(tpD, 1)
		}
		src := Rank{TP: srcTP, Stage: srcStage}
		plan, err := NewPlan(&p, src)
		if err != nil {
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("unmarked error %v", err)
			}
			return
		}
		if len(plan.Routes) != p.Decode.TP*p.Decode.PP() {
			t.Fatalf("%d routes for %d decode ranks", len(plan.Routes), p.Decode.TP*p.Decode.PP())
		}
		sLo, sHi := p.Prefill.StageLayers(src.Stage)
		hLo, hHi := p.Prefill.RankHeads(src.TP)
		for i := range plan.Routes {
			r := &plan.Routes[i]
			if r.Empty() {
				continue
			}
			dLo, dHi := p.Decode.StageLayers(r.Dest.Stage)
			gLo, gHi := p.Decode.RankHeads(r.Dest.TP)
			switch {
			case r.LayerLo < max(sLo, dLo) || r.LayerHi > min(sHi, dHi):
				t.Fatalf("route to %+v: layers [%d, %d) outside [%d, %d) and [%d, %d)", r.Dest, r.LayerLo, r.LayerHi, sLo, sHi, dLo, dHi)
			case r.HeadLo < max(hLo, gLo) || r.HeadHi > min(hHi, gHi) || r.HeadLo >= r.HeadHi:
				t.Fatalf("route to %+v: heads [%d, %d) outside [%d, %d) and [%d, %d)", r.Dest, r.HeadLo, r.HeadHi, hLo, hHi, gLo, gHi)
			case r.SrcItem != p.Prefill.ItemLen() || r.DstItem != p.Decode.ItemLen():
				t.Fatalf("route to %+v: items %d / %d", r.Dest, r.SrcItem, r.DstItem)
			case r.PageBytes() != uint64(r.HeadHi-r.HeadLo)*uint64(page)*p.Prefill.HeadBytes():
				t.Fatalf("route to %+v: %d bytes per page for %d heads", r.Dest, r.PageBytes(), r.HeadHi-r.HeadLo)
			}
			for _, pc := range r.Pieces {
				n := uint64(pc.Count - 1)
				if pc.Count < 1 || pc.Len == 0 || pc.Src+n*pc.SrcStride+pc.Len > r.SrcItem || pc.Dst+n*pc.DstStride+pc.Len > r.DstItem {
					t.Fatalf("route to %+v: piece %+v outside pages of %d / %d bytes", r.Dest, pc, r.SrcItem, r.DstItem)
				}
			}
			for b := -1; b <= (sHi-sLo)*p.Prefill.Kinds(); b++ {
				db, ok := r.DstBuffer(b)
				if ok && (b < 0 || db < 0 || db >= (dHi-dLo)*p.Decode.Kinds()) {
					t.Fatalf("route to %+v: prefill buffer %d -> decode buffer %d of %d", r.Dest, b, db, (dHi-dLo)*p.Decode.Kinds())
				}
			}
			runs := []cp.Run{{Src: 0, Dst: 2, Len: 2}, {Src: 3, Dst: 0, Len: 1}} // within 4 pages on both sides
			if r.Blocks(runs) > 1<<16 {
				continue
			}
			bs := r.AppendBlocks(nil, runs, 0, 0)
			if len(bs) != r.Blocks(runs) {
				t.Fatalf("route to %+v: %d blocks, Blocks says %d", r.Dest, len(bs), r.Blocks(runs))
			}
			var sum uint64
			for _, b := range bs {
				if b.Src+b.Len > 4*r.SrcItem || b.Dst+b.Len > 4*r.DstItem {
					t.Fatalf("route to %+v: block %+v outside 4 pages of %d / %d bytes", r.Dest, b, r.SrcItem, r.DstItem)
				}
				sum += b.Len
			}
			if sum != 3*r.PageBytes() {
				t.Fatalf("route to %+v: %d bytes for 3 pages of %d", r.Dest, sum, r.PageBytes())
			}
		}
	})
}

// even cuts layers into n stages as evenly as possible; n < 1 gives nil
// (one stage), and stages that cannot all hold a layer are left for
// Validate to refuse.
func even(layers, n int) []int {
	if n < 1 {
		return nil
	}
	s := make([]int, n+1)
	for i := range s {
		s[i] = i * max(layers, 0) / n
	}
	return s
}
