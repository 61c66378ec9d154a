package workload

import (
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
)

// A sharded run (--prefill-tp, --decode-tp): one prefill engine per prefill
// TP rank, each with its own pool, its own stream of one virtual GPU (the
// ranks' forwards run concurrently, as real TP ranks' do) and its own
// transport, so its own modeled link; one decode pool per decode TP rank,
// added to every engine as a peer with its sharding. Each request is
// registered on every engine with one destination per decode rank; the
// engines route each byte through cp/reshard. The model writes every rank's
// share of one logical tensor: the bytes of (room, layer, kind, token, head)
// are a pattern of those values, so every decode byte is checked against
// what the whole-tensor reshard puts there, head slice by head slice.

func (c Config) sharded() bool {
	return c.PrefillTP > 0 || c.DecodeTP > 0 || c.PrefillPP > 0 || c.DecodePP > 0
}

// tpFlags names the pairing in errors, as the user spelled it.
func (c Config) tpFlags() string {
	pp := ""
	if c.PrefillPP > 0 || c.DecodePP > 0 {
		pp = fmt.Sprintf(" --prefill-pp %d --decode-pp %d", c.PrefillPP, c.DecodePP)
	}
	return fmt.Sprintf("--prefill-tp %d --decode-tp %d%s (--model %s)", c.PrefillTP, c.DecodeTP, pp, c.Preset.Name)
}

func badFlag(err error, format string, args ...any) error {
	return errors.Mark(errors.Wrapf(err, format, args...), system.ErrBadInput)
}

// shardedGeometry checks the pairing (before anything is allocated) and
// picks the scale: a divisor of the head dim, so that head slicing, and so
// every write count, stays the real one while the bytes shrink.
func (c Config) shardedGeometry(g *geometry) error {
	g.sharded = true
	p := c.Preset
	if p.KVHeads < 1 || p.HeadDim < 1 || p.ElemBytes < 1 {
		return errors.Newf("--model %s: no KV head geometry, cannot shard", p.Name)
	}
	pre := reshard.Side{Layers: g.layers, KVHeads: p.KVHeads, HeadDim: p.HeadDim, ElemBytes: p.ElemBytes, MLA: p.MLA,
		TP: max(1, c.PrefillTP), PageSize: c.PageSize, Order: c.PageOrder}
	dec := pre
	dec.TP = max(1, c.DecodeTP)
	if c.PrefillTP < 0 || c.DecodeTP < 0 || c.PrefillPP < 0 || c.DecodePP < 0 {
		return errors.Mark(errors.Newf("%s: TP and PP degrees must not be negative", c.tpFlags()), system.ErrBadInput)
	}
	// PP is bounded by the layers before a stage list is sized from it
	// (--decode-pp 9223372036854775807 panicked in makeslice).
	var err error
	if pre.Stages, err = reshard.SplitStages(g.layers, c.PrefillPP); err != nil {
		return badFlag(err, "--prefill-pp %d (--model %s, %d layers)", c.PrefillPP, p.Name, g.layers)
	}
	if dec.Stages, err = reshard.SplitStages(g.layers, c.DecodePP); err != nil {
		return badFlag(err, "--decode-pp %d (--model %s, %d layers)", c.DecodePP, p.Name, g.layers)
	}
	pair := reshard.Pairing{Prefill: pre, Decode: dec}
	if _, err := reshard.NewPlan(&pair, reshard.Rank{}); err != nil {
		return badFlag(err, "%s", c.tpFlags())
	}
	for st := 0; st < pre.PP(); st++ {
		if lo, _ := pre.StageLayers(st); lo >= g.hookLayers {
			return errors.Mark(errors.Newf("%s: prefill PP stage %d holds only layers without a hook (from %d on)", c.tpFlags(), st, g.hookLayers), system.ErrBadInput)
		}
	}
	g.preReal, g.decReal = pre, dec
	g.pageBytes = int(pre.ItemLen()) // one prefill rank's page of one buffer, as the report's item
	pool := float64(g.pagesPerRequest * g.resident)
	need := max(float64(pre.TP)*float64(pre.ItemLen()), float64(dec.TP)*float64(dec.ItemLen())) * pool * float64(g.buffers)
	budget := float64(c.MemoryBudget)
	if budget <= 0 {
		budget = 256 << 20
	}
	g.scale = c.Scale
	switch {
	case g.scale > 0 && p.HeadDim%g.scale != 0:
		return errors.Mark(errors.Newf("--scale %d: a sharded run scales the head dim, and %d does not divide %s's %d",
			g.scale, g.scale, p.Name, p.HeadDim), system.ErrBadInput)
	case g.scale == 0:
		g.scale = p.HeadDim
		for s := 1; s <= p.HeadDim; s++ {
			if p.HeadDim%s == 0 && need/float64(s) <= budget {
				g.scale = s
				break
			}
		}
	}
	g.preSide, g.decSide = pre, dec
	g.preSide.HeadDim /= g.scale
	g.decSide.HeadDim /= g.scale
	g.itemLen = int(g.preSide.ItemLen())
	g.byteScale = float64(g.scale)
	return nil
}

// pageFill writes what a model writes into one page of (layer, kind) of TP
// rank tp on side s for request position pos: every head the rank holds,
// each (token, head) its own pattern, laid out in the side's page order.
func pageFill(dst []byte, s *reshard.Side, tp int, seed, room uint64, layer, kind, pos int) {
	lo, hi := s.RankHeads(tp)
	per, hb := hi-lo, int(s.HeadBytes())
	for t := 0; t < s.PageSize; t++ {
		for h := lo; h < hi; h++ {
			off := (t*per + h - lo) * hb
			if s.Order == reshard.HeadMajor {
				off = ((h-lo)*s.PageSize + t) * hb
			}
			testbed.Fill(dst[off:off+hb], seed, room, layer*2+kind, (pos*s.PageSize+t)*s.KVHeads+h)
		}
	}
}

// layerKind is buffer b's model layer and kind in testbed's layout of PP
// stage st's pool (K of every layer of the stage, then V; MLA one per
// layer).
func layerKind(s *reshard.Side, st, b int) (layer, kind int) {
	lo, hi := s.StageLayers(st)
	if s.MLA {
		return lo + b, 0
	}
	return lo + b%(hi-lo), b / (hi - lo)
}

// geometryOf is the pool of a rank of PP stage st.
func geometryOf(s *reshard.Side, st, pages int) testbed.Geometry {
	lo, hi := s.StageLayers(st)
	if s.MLA {
		return testbed.MLA(hi-lo, s.ItemLen(), pages)
	}
	return testbed.KV(hi-lo, s.ItemLen(), pages)
}

// prefillGeometry is the pool of a prefill rank of PP stage st: in an
// unsharded run the whole model's, which is also its decode pool's.
func prefillGeometry(cfg Config, g geometry, st, pages int) testbed.Geometry {
	switch {
	case g.sharded:
		return geometryOf(&g.preSide, st, pages)
	case cfg.Preset.MLA:
		return testbed.MLA(g.layers, uint64(g.itemLen), pages)
	}
	return testbed.KV(g.layers, uint64(g.itemLen), pages)
}

// rankStream names prefill rank (st, r)'s stream and link.
func rankStream(st, r int) string { return fmt.Sprintf("prefill-pp%d-tp%d", st, r) }
