package workload

import (
	"context"
	"fmt"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// The two-process mode's sharded run: the prefill process runs every
// prefill (PP stage, TP rank) engine as the sim does, and its decode side
// is a ShardedPlane, the decode ranks of another process, each a peer with
// its sharding. Both processes derive the same sides from a Shard, which
// the decode process checks against its own flags before it sizes a pool,
// and the decode ranks check their pages with PageFill, the sim's own
// pattern.

// Shard is a sharded run's pairing, as the two processes of the
// two-process mode must agree on it: the model, each side's TP degree and
// PP stages, the page size and order, and the byte scale the prefill
// picked. Zero TP or PP degrees mean 1, as the flags do.
type Shard struct {
	Model string
	// Layers counts every layer that owns a buffer: the hook layers
	// (--layers, or the preset's) and the preset's hookless ones.
	Layers                                   int
	PrefillTP, DecodeTP, PrefillPP, DecodePP int
	PageSize                                 int
	Order                                    reshard.Order
	// Scale divides the model's head dim: what one head of one token
	// takes in memory (the sim's --scale, as the prefill resolved it).
	Scale int
}

// String spells the pairing as flags.
func (s Shard) String() string {
	return fmt.Sprintf("--model %s (%d layers) --prefill-tp %d --prefill-pp %d --decode-tp %d --decode-pp %d --page-size %d --page-order %s, head dim / %d",
		s.Model, s.Layers, max(1, s.PrefillTP), max(1, s.PrefillPP), max(1, s.DecodeTP), max(1, s.DecodePP), s.PageSize, s.Order, s.Scale)
}

// Sides returns the pairing's prefill and decode sides as allocated (the
// head dim divided by Scale), or an error marked system.ErrBadInput that
// names the value when the pairing cannot be resharded. Every field is
// bounded before anything is sized from it: a Shard may come from the
// network.
func (s Shard) Sides() (pre, dec reshard.Side, err error) {
	p, ok := Presets[s.Model]
	bad := func(format string, args ...any) error {
		return errors.Mark(errors.Newf(format, args...), system.ErrBadInput)
	}
	switch {
	case !ok:
		return pre, dec, bad("--model %.64q: want one of %s", s.Model, strings.Join(PresetNames(), ", "))
	case s.Layers <= p.ExtraLayers || s.Layers > reshard.MaxLayers:
		return pre, dec, bad("--model %s: %d layers: want %d to %d (at least one hook layer)", s.Model, s.Layers, p.ExtraLayers+1, reshard.MaxLayers)
	case s.PrefillTP < 0 || s.DecodeTP < 0 || s.PrefillTP > reshard.MaxTP || s.DecodeTP > reshard.MaxTP:
		return pre, dec, bad("--prefill-tp %d --decode-tp %d: want 0 to %d", s.PrefillTP, s.DecodeTP, reshard.MaxTP)
	case s.PrefillPP < 0 || s.DecodePP < 0 || s.PrefillPP > s.Layers || s.DecodePP > s.Layers:
		return pre, dec, bad("--prefill-pp %d --decode-pp %d: want 0 to the %d layers", s.PrefillPP, s.DecodePP, s.Layers)
	case s.Scale < 1 || p.HeadDim%s.Scale != 0:
		return pre, dec, bad("head dim / %d: the scale must divide %s's head dim %d", s.Scale, s.Model, p.HeadDim)
	}
	pre = reshard.Side{Layers: s.Layers, KVHeads: p.KVHeads, HeadDim: p.HeadDim / s.Scale, ElemBytes: p.ElemBytes, MLA: p.MLA,
		TP: max(1, s.PrefillTP), Stages: reshard.EvenStages(s.Layers, s.PrefillPP), PageSize: s.PageSize, Order: s.Order}
	dec = pre
	dec.TP, dec.Stages = max(1, s.DecodeTP), reshard.EvenStages(s.Layers, s.DecodePP)
	pair := reshard.Pairing{Prefill: pre, Decode: dec}
	if _, err := reshard.NewPlan(&pair, reshard.Rank{}); err != nil {
		return pre, dec, badFlag(err, "%s", s)
	}
	return pre, dec, nil
}

// shardOf is the pairing of a validated sharded configuration.
func shardOf(c Config, g geometry) Shard {
	return Shard{Model: c.Preset.Name, Layers: g.layers, PrefillTP: c.PrefillTP, DecodeTP: c.DecodeTP, PrefillPP: c.PrefillPP,
		DecodePP: c.DecodePP, PageSize: c.PageSize, Order: c.PageOrder, Scale: g.scale}
}

// PageFill writes what the sim's model writes into one page of (layer,
// kind) of TP rank tp on side s, for position pos of room: every head the
// rank holds, each (token, head) its own pattern, in the side's page
// order. Every rank's pages are shares of one logical tensor, so a decode
// rank checks what it received against it whatever the prefill's sharding.
func PageFill(dst []byte, s *reshard.Side, tp int, seed, room uint64, layer, kind, pos int) {
	pageFill(dst, s, tp, seed, room, layer, kind, pos)
}

// LayerKind is buffer b's model layer and kind (0: K or the MLA latent,
// 1: V) in the pool of a rank of PP stage st on side s (RankGeometry).
func LayerKind(s *reshard.Side, st, b int) (layer, kind int) { return layerKind(s, st, b) }

// RankGeometry is the pool of a rank of PP stage st on side s, of pages
// pages per buffer: the stage's layers (every K, then every V; MLA one
// latent each), numbered within the stage, of the side's item length.
func RankGeometry(s *reshard.Side, st, pages int) testbed.Geometry { return geometryOf(s, st, pages) }

// DecodeRank is one decode rank of a sharded run as the prefill process
// addresses it.
type DecodeRank struct {
	Rank reshard.Rank
	// Geometry is the pool the rank must have (RankGeometry of the decode
	// side): what the prefill's engines write, whatever their own item
	// length.
	Geometry testbed.Geometry
}

// ShardedPlane is a DataPlane whose decode side is sharded: one decode
// rank per (PP stage, TP rank) of the pairing's decode side, each with its
// own pool. Its ChunkDone hears of a chunk once every prefill rank's Finish
// returned for it (not successful if any was not), for every decode rank:
// only then has every byte of the chunk landed in each.
type ShardedPlane interface {
	DataPlane
	// OpenSharded readies every decode rank of ranks (stage-major) for the
	// pairing shard, the model's bytes seeded by seed. It returns the
	// transport every prefill rank sends over and one peer per rank, in
	// the same order; the run gives each its Sharding. It returns when ctx
	// (the run's) ends.
	OpenSharded(ctx context.Context, shard Shard, ranks []DecodeRank, seed uint64, log *zap.Logger) (rdma.Transport, []system.Peer, error)
}

// openRemote opens the decode side of a two-process sharded run: the
// decode ranks' peers, each with its sharding, and the transport every
// prefill rank shares.
func openRemote(ctx context.Context, remote ShardedPlane, cfg Config, g geometry, p *plan, log *zap.Logger) (rdma.Transport, []system.Peer, error) {
	var ranks []DecodeRank
	for i := 0; i < g.decSide.PP()*g.decSide.TP; i++ {
		st, d := i/g.decSide.TP, i%g.decSide.TP
		ranks = append(ranks, DecodeRank{Rank: reshard.Rank{TP: d, Stage: st}, Geometry: geometryOf(&g.decSide, st, p.pool)})
	}
	tr, peers, err := remote.OpenSharded(ctx, shardOf(cfg, g), ranks, cfg.Seed, log)
	if err != nil {
		return nil, nil, err
	}
	if len(peers) != len(ranks) {
		return nil, nil, errors.AssertionFailedf("%d peers for %d decode ranks", len(peers), len(ranks))
	}
	for i := range peers {
		peers[i].Sharding = &system.Sharding{Side: g.decSide, Rank: ranks[i].Rank}
	}
	return tr, peers, nil
}
