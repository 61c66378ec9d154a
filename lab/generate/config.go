package generate

import (
	"fmt"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/system"
)

// Plant is a production bug the rig commits on purpose, to show which
// oracle catches it.
type Plant int

const (
	// NoPlant: the rig does everything right.
	NoPlant Plant = iota
	// PlantChunkPositions registers every chunk with its range counted
	// from the chunk, [0, length), so its positions start at 0 (invariant
	// 5, the seed's bug): chunk N's KV lands on chunk 0's decode pages.
	// Each chunk is then finished before the next registers (they share a
	// key). Needs two chunks.
	PlantChunkPositions
	// PlantRoPEOffset rotates every chunk after the first at positions one
	// chunk early (a serving stack that passed chunk-relative positions
	// shifted by a chunk): the KV is wrong before any transfer, so every
	// byte arrives as written. Needs two chunks.
	PlantRoPEOffset
	// PlantHeadsSwapped describes the decode ranks 0 and 1 of PP stage 0
	// to the prefill with each other's TP rank: their KV heads arrive
	// swapped. Needs those ranks to hold different heads (GQA).
	PlantHeadsSwapped
	// PlantStalePage runs a previous request (another prompt) into the
	// same decode pages first, then registers the request's first chunk
	// from its second page (invariant 6): its first page is never sent and
	// the decode reads the previous request's KV there.
	PlantStalePage
	// PlantHooklessNotSent leaves the extra layer's buffer (the one no hook
	// covers) out of the engine's buffers: its KV is never sent
	// (invariant 3). Needs a model with an extra layer, and no sharding
	// (TP 1 and PP 1 on both sides: a sharded engine checks that its
	// buffers cover its layers).
	PlantHooklessNotSent
	// PlantTPReplicasSend configures every prefill TP rank's engine as TP
	// rank 0 of its stage: where the TP ranks hold the same KV (the MLA
	// latent, replicated), each then takes itself for the replica that
	// sends, and every destination byte arrives once per replica. The
	// bytes and tokens are right; only the bytes posted against what the
	// decode pages hold (lab/landguard's ledger) show it. Needs --prefill-tp
	// 2 or more over ranks that hold the same heads.
	PlantTPReplicasSend
)

var plantNames = map[Plant]string{
	NoPlant: "none", PlantChunkPositions: "chunk-positions", PlantRoPEOffset: "rope-offset",
	PlantHeadsSwapped: "heads-swapped", PlantStalePage: "stale-page", PlantHooklessNotSent: "hookless-not-sent",
	PlantTPReplicasSend: "tp-replicas-send",
}

// Plants lists every plant, NoPlant first.
func Plants() []Plant {
	out := make([]Plant, 0, len(plantNames))
	for p := NoPlant; p <= PlantTPReplicasSend; p++ {
		out = append(out, p)
	}
	return out
}

// ParsePlant reads a plant by its name (Plant.String), naming the choices
// otherwise (an error marked system.ErrBadInput).
func ParsePlant(name string) (Plant, error) {
	names := make([]string, 0, len(plantNames))
	for _, p := range Plants() {
		if p.String() == name {
			return p, nil
		}
		names = append(names, p.String())
	}
	return 0, errors.Mark(errors.Newf("--plant %q: want one of %s", name, strings.Join(names, ", ")), system.ErrBadInput)
}

func (p Plant) String() string {
	if n, ok := plantNames[p]; ok {
		return n
	}
	return fmt.Sprintf("Plant(%d)", int(p))
}

// Config is one generate run.
type Config struct {
	Model tinylm.Config
	// PromptTokens are prefilled; NewTokens are then decoded after the
	// prefill's first token.
	PromptTokens, NewTokens int
	// ChunkTokens is the token budget of one forward (chunked prefill).
	ChunkTokens int
	PageSize    int
	// GroupSize is K, the hook layers per submit.
	GroupSize int
	// CP is the prefill's context-parallel size; CPRule how its ranks
	// split the pages.
	CP     int
	CPRule cp.Rule
	// TP degrees and PP stages of each side (0 means 1); the layers split
	// into near-equal stages.
	PrefillTP, DecodeTP, PrefillPP, DecodePP int
	// PageOrder is both sides' page layout.
	PageOrder reshard.Order
	// LinkGbps is each prefill rank's modeled link rate; LinkLatency its
	// per-batch latency.
	LinkGbps    float64
	LinkLatency time.Duration
	// Seed draws the prompt and the page tables.
	Seed uint64
	// FinishTimeout bounds each Finish.
	FinishTimeout time.Duration
	// Submitters per engine.
	Submitters int
	// Monolithic also runs the monolithic send for comparison.
	Monolithic bool
	// Plant commits a bug on purpose (tests).
	Plant Plant
}

// Defaults is what `kvstream generate` runs without flags: tiny-gqa, a
// 256-token prompt in four chunks, 16 new tokens, both modes.
func Defaults() Config {
	return Config{Model: tinylm.Presets["tiny-gqa"], PromptTokens: 256, NewTokens: 16, ChunkTokens: 64, PageSize: 16,
		GroupSize: 2, CP: 1, PageOrder: reshard.HeadMajor, LinkGbps: 1, LinkLatency: 5 * time.Microsecond, Seed: 1,
		FinishTimeout: 30 * time.Second, Submitters: 2, Monolithic: true}
}

// Bounds on what a run may ask for: far above what a CPU forward finishes
// in reasonable time, and small enough that no size computation overflows.
const (
	MaxTokens = 1 << 16
	MaxDegree = 64
)

func flagError(format string, args ...any) error {
	return errors.Mark(errors.Newf(format, args...), system.ErrBadInput)
}

// geometry is what a validated configuration implies.
type geometry struct {
	pre, dec    reshard.Side
	hooks       int // the model's hook layers
	promptPages int // the pages the transfer moves
	reqPages    int // the pages a request holds with its generated tokens
	poolPages   int
}

func degree(n int) int { return max(1, n) }

// check validates the configuration before anything is allocated; errors
// name the flag and the value.
func (c *Config) check() (geometry, error) {
	var g geometry
	if err := c.Model.Validate(); err != nil {
		return g, errors.Mark(errors.Wrapf(err, "--model %s", c.Model.Name), system.ErrBadInput)
	}
	switch {
	case c.PromptTokens < 1 || c.PromptTokens > MaxTokens:
		return g, flagError("--prompt-tokens %d: must be within [1, %d]", c.PromptTokens, MaxTokens)
	case c.NewTokens < 1 || c.NewTokens > MaxTokens:
		return g, flagError("--new-tokens %d: must be within [1, %d]", c.NewTokens, MaxTokens)
	case c.PageSize < 1 || c.PageSize > c.PromptTokens+c.NewTokens:
		return g, flagError("--page-size %d: must be within [1, %d] (prompt and new tokens)", c.PageSize, c.PromptTokens+c.NewTokens)
	case c.ChunkTokens < c.PageSize || c.ChunkTokens > MaxTokens:
		return g, flagError("--chunk-tokens %d: must be within [--page-size %d, %d]", c.ChunkTokens, c.PageSize, MaxTokens)
	case c.GroupSize < 1:
		return g, flagError("--group %d: must be at least 1", c.GroupSize)
	case c.CP < 1 || c.CP > MaxDegree:
		return g, flagError("--cp %d: must be within [1, %d]", c.CP, MaxDegree)
	case c.CPRule != cp.SharedKV && c.CPRule != cp.Contiguous:
		return g, flagError("--cp-rule %d: unknown", int(c.CPRule))
	case !(c.LinkGbps > 0 && c.LinkGbps <= 1e6): // NaN fails too
		return g, flagError("--link-gbps %v: must be within (0, 1e6]", c.LinkGbps)
	case c.LinkLatency < 0 || c.LinkLatency > time.Second:
		return g, flagError("--link-latency-us %v: must be within [0, 1 s]", c.LinkLatency)
	case c.FinishTimeout <= 0:
		return g, flagError("--finish-timeout %v: must be positive", c.FinishTimeout)
	case c.Submitters < 1 || c.Submitters > MaxDegree:
		return g, flagError("submitters %d: must be within [1, %d]", c.Submitters, MaxDegree)
	}
	for _, d := range []struct {
		flag string
		v    int
	}{{"--prefill-tp", c.PrefillTP}, {"--decode-tp", c.DecodeTP}, {"--prefill-pp", c.PrefillPP}, {"--decode-pp", c.DecodePP}} {
		if d.v < 0 || d.v > MaxDegree {
			return g, flagError("%s %d: must be within [0, %d]", d.flag, d.v, MaxDegree)
		}
	}
	m := &c.Model
	layers := m.Layers()
	if degree(c.PrefillPP) > layers || degree(c.DecodePP) > layers {
		return g, flagError("--prefill-pp %d --decode-pp %d: --model %s has %d layers", c.PrefillPP, c.DecodePP, m.Name, layers)
	}
	g.pre = m.Side(degree(c.PrefillTP), reshard.EvenStages(layers, degree(c.PrefillPP)), c.PageSize, c.PageOrder)
	g.dec = m.Side(degree(c.DecodeTP), reshard.EvenStages(layers, degree(c.DecodePP)), c.PageSize, c.PageOrder)
	pairing := fmt.Sprintf("--prefill-tp %d --decode-tp %d --prefill-pp %d --decode-pp %d (--model %s)",
		degree(c.PrefillTP), degree(c.DecodeTP), degree(c.PrefillPP), degree(c.DecodePP), m.Name)
	if _, err := reshard.NewPlan(&reshard.Pairing{Prefill: g.pre, Decode: g.dec}, reshard.Rank{}); err != nil {
		return g, errors.Mark(errors.Wrapf(err, "%s", pairing), system.ErrBadInput)
	}
	for _, s := range []*reshard.Side{&g.pre, &g.dec} {
		if err := m.CheckSide(s); err != nil {
			return g, errors.Mark(errors.Wrapf(err, "%s", pairing), system.ErrBadInput)
		}
	}
	g.hooks = m.HookLayers
	for st := 0; st < g.pre.PP(); st++ {
		if lo, _ := g.pre.StageLayers(st); lo >= g.hooks {
			return g, flagError("%s: prefill PP stage %d holds only layers without a hook (from %d on)", pairing, st, g.hooks)
		}
	}
	g.promptPages = (c.PromptTokens + c.PageSize - 1) / c.PageSize
	if minGbps, bytes := c.minLinkGbps(&g); c.LinkGbps <= minGbps {
		return g, flagError("--link-gbps %v: must be above %.6g Gb/s for this run: its %.0f bytes on one link would take longer than a duration holds (time.Duration's range, about 292 years)",
			c.LinkGbps, minGbps, bytes)
	}
	g.reqPages = (c.PromptTokens + c.NewTokens + c.PageSize - 1) / c.PageSize
	// Room for the request and, spread among them, as many free pages, so
	// that the page tables are scattered.
	g.poolPages = 2 * g.reqPages
	return g, c.checkPlant(&g)
}

// MaxModeledNs is the longest duration, in nanoseconds, that a run may
// model: time.Duration's range (see loopback.Options.LinkTime), less a
// relative 1e-9 for the rounding of the float arithmetic that computes the
// same times by other expressions (the link's, the floor's).
const MaxModeledNs = float64(loopback.MaxModeled) * (1 - 1e-9)

// localRequests is the most requests a local run transfers (a planted run's
// two, on the same pages).
const localRequests = 2

// minLinkGbps is the bound on --link-gbps: at it, every byte a local run
// sends (every prompt page of its requests, to every decode rank, at their
// real size), on one link, plus the link latency, takes MaxModeledNs, the
// longest a batch's time on the link or the floor's last landing may be
// (bits over Gb/s is nanoseconds). A slower rate wrapped those times. It
// returns the bytes too, for the error.
func (c *Config) minLinkGbps(g *geometry) (gbps, bytes float64) {
	perPage := float64(g.pre.Layers*g.pre.Kinds()) * max(float64(g.pre.TP)*float64(g.pre.ItemLen()), float64(g.dec.TP)*float64(g.dec.ItemLen()))
	bytes = perPage * float64(g.promptPages) * localRequests
	return 8 * bytes / (MaxModeledNs - float64(c.LinkLatency)), bytes
}

// checkPlant refuses a plant the configuration cannot show.
func (c *Config) checkPlant(g *geometry) error {
	chunks := (c.PromptTokens + c.ChunkTokens - 1) / c.ChunkTokens
	switch c.Plant {
	case NoPlant:
	case PlantChunkPositions, PlantRoPEOffset:
		if chunks < 2 {
			return flagError("plant %s needs two chunks: --prompt-tokens %d in chunks of %d is one", c.Plant, c.PromptTokens, c.ChunkTokens)
		}
	case PlantHeadsSwapped:
		lo0, _ := g.dec.RankHeads(0)
		if g.dec.TP < 2 {
			return flagError("plant %s needs --decode-tp 2 or more", c.Plant)
		}
		if lo1, _ := g.dec.RankHeads(1); lo0 == lo1 {
			return flagError("plant %s: decode TP ranks 0 and 1 hold the same heads (--model %s at TP %d)", c.Plant, c.Model.Name, g.dec.TP)
		}
	case PlantStalePage:
		if min(c.ChunkTokens, c.PromptTokens) <= c.PageSize {
			return flagError("plant %s needs a first chunk of two pages or more", c.Plant)
		}
	case PlantHooklessNotSent:
		if c.Model.ExtraLayers == 0 {
			return flagError("plant %s: --model %s has no layer without a hook", c.Plant, c.Model.Name)
		}
		if g.pre.TP != 1 || g.dec.TP != 1 || g.pre.PP() != 1 || g.dec.PP() != 1 {
			return flagError("plant %s needs TP 1 and PP 1 on both sides", c.Plant)
		}
	case PlantTPReplicasSend:
		if g.pre.TP < 2 {
			return flagError("plant %s needs --prefill-tp 2 or more", c.Plant)
		}
		lo0, hi0 := g.pre.RankHeads(0)
		if lo1, hi1 := g.pre.RankHeads(1); lo0 != lo1 || hi0 != hi1 {
			return flagError("plant %s: prefill TP ranks 0 and 1 hold different heads (--model %s at TP %d): they are no replicas", c.Plant, c.Model.Name, g.pre.TP)
		}
	default:
		return flagError("plant %d: unknown", int(c.Plant))
	}
	return nil
}
