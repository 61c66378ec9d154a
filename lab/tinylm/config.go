package tinylm

import (
	"slices"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
)

// ErrBadInput marks errors about values that describe no valid model,
// sharding or cache; it is reshard's (and cp's) class.
var ErrBadInput = reshard.ErrBadInput

func badInput(format string, args ...any) error {
	return errors.Mark(errors.Newf(format, args...), ErrBadInput)
}

// Arch is the attention variant.
type Arch int

const (
	// GQA is grouped-query attention: KVHeads K and V heads, each shared by
	// QHeads/KVHeads query heads; a K and a V buffer per layer.
	GQA Arch = iota
	// MLA is multi-head latent attention: per token one latent (LatentDim,
	// RMS-normalized) and one RoPE key (RoPEDim) shared by every head,
	// stored as one KV "head" of LatentDim+RoPEDim elements; one buffer per
	// layer, replicated on every TP rank.
	MLA
)

// ElemBytes is the bytes of one stored KV element (float32).
const ElemBytes = 4

// LogitTolerance bounds the difference between the logits of two decodes
// of the same KV whose ranks sum their partial outputs in different orders
// (different TP degrees). Arithmetic is float64; the KV is stored as
// float32, so a last-bit difference in a hidden state can move a stored
// element by one float32 ulp (a relative 6e-8), which the attention
// carries into the logits (of size ~10) well below this bound. Equal
// arrangements give equal bits.
const LogitTolerance = 1e-4

// Config is a model's shape and seed.
type Config struct {
	Name string
	Arch Arch
	// Vocab tokens, Hidden width, Inter the SwiGLU width.
	Vocab, Hidden, Inter int
	// HookLayers fire LayerEnd; ExtraLayers follow them and fire none (the
	// MTP-like layer of tiny-mla).
	HookLayers, ExtraLayers int
	// QHeads query heads.
	QHeads int
	// KVHeads and HeadDim: GQA's KV heads and every head's width.
	KVHeads, HeadDim int
	// MLA: the latent's width, the decoupled RoPE key's, and per head the
	// non-RoPE query/key width and the value width.
	LatentDim, RoPEDim, NoPEDim, VDim int
	// RoPETheta is RoPE's base.
	RoPETheta float64
	// Seed draws every weight.
	Seed uint64
}

// Presets are the shipped models. Their sizes keep a forward over a few
// hundred tokens in milliseconds on one core.
var Presets = map[string]Config{
	"tiny-gqa": {Name: "tiny-gqa", Arch: GQA, Vocab: 512, Hidden: 64, Inter: 128, HookLayers: 6,
		QHeads: 8, KVHeads: 4, HeadDim: 16, RoPETheta: 10000, Seed: 1},
	"tiny-mla": {Name: "tiny-mla", Arch: MLA, Vocab: 512, Hidden: 64, Inter: 128, HookLayers: 5, ExtraLayers: 1,
		QHeads: 8, LatentDim: 32, RoPEDim: 8, NoPEDim: 16, VDim: 16, RoPETheta: 10000, Seed: 2},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	var out []string
	for n := range Presets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Preset returns a preset by name.
func Preset(name string) (Config, error) {
	c, ok := Presets[name]
	if !ok {
		return Config{}, badInput("model %q: want one of %s", name, strings.Join(PresetNames(), ", "))
	}
	return c, nil
}

// Layers is every layer that owns KV: the hooked ones and the extra ones.
func (c Config) Layers() int { return c.HookLayers + c.ExtraLayers }

// KVHeadCount is the KV heads of the page layout: GQA's, or MLA's one
// latent.
func (c Config) KVHeadCount() int {
	if c.Arch == MLA {
		return 1
	}
	return c.KVHeads
}

// KVWidth is the elements of one KV head of one token: GQA's head dim, or
// MLA's latent plus its RoPE key.
func (c Config) KVWidth() int {
	if c.Arch == MLA {
		return c.LatentDim + c.RoPEDim
	}
	return c.HeadDim
}

// Validate checks the shape.
func (c Config) Validate() error {
	switch {
	case c.Vocab < 2 || c.Hidden < 2 || c.Inter < 1:
		return badInput("model %s: vocab %d, hidden %d, inter %d: too small", c.Name, c.Vocab, c.Hidden, c.Inter)
	case c.HookLayers < 1 || c.ExtraLayers < 0:
		return badInput("model %s: %d hooked and %d extra layers", c.Name, c.HookLayers, c.ExtraLayers)
	case c.QHeads < 1:
		return badInput("model %s: %d query heads", c.Name, c.QHeads)
	case c.RoPETheta <= 1:
		return badInput("model %s: RoPE theta %v", c.Name, c.RoPETheta)
	}
	switch c.Arch {
	case GQA:
		switch {
		case c.KVHeads < 1 || c.QHeads%c.KVHeads != 0:
			return badInput("model %s: %d query heads do not group over %d KV heads", c.Name, c.QHeads, c.KVHeads)
		case c.HeadDim < 2 || c.HeadDim%2 != 0:
			return badInput("model %s: head dim %d: RoPE needs an even width", c.Name, c.HeadDim)
		}
	case MLA:
		switch {
		case c.LatentDim < 1 || c.NoPEDim < 1 || c.VDim < 1:
			return badInput("model %s: latent %d, nope %d, v %d: must be positive", c.Name, c.LatentDim, c.NoPEDim, c.VDim)
		case c.RoPEDim < 2 || c.RoPEDim%2 != 0:
			return badInput("model %s: RoPE dim %d: RoPE needs an even width", c.Name, c.RoPEDim)
		}
	default:
		return badInput("model %s: architecture %d: unknown", c.Name, int(c.Arch))
	}
	return nil
}

// Side is the page layout of the model's KV on one side: tp ranks, PP stage
// boundaries (nil: one stage), page size and order.
func (c Config) Side(tp int, stages []int, pageSize int, order reshard.Order) reshard.Side {
	return reshard.Side{Layers: c.Layers(), KVHeads: c.KVHeadCount(), HeadDim: c.KVWidth(), ElemBytes: ElemBytes,
		MLA: c.Arch == MLA, TP: tp, Stages: slices.Clone(stages), PageSize: pageSize, Order: order}
}

// CheckSide checks that a side lays out this model's KV and that its TP
// degree splits the model's query heads and SwiGLU width.
func (c Config) CheckSide(s *reshard.Side) error {
	if err := s.Validate("side"); err != nil {
		return err
	}
	want := c.Side(s.TP, s.Stages, s.PageSize, s.Order)
	switch {
	case s.Layers != want.Layers || s.KVHeads != want.KVHeads || s.HeadDim != want.HeadDim ||
		s.ElemBytes != want.ElemBytes || s.MLA != want.MLA:
		return badInput("model %s: side of %d layers, %d KV heads of %d x %d bytes (MLA %v), the model's KV is %d layers, %d heads of %d x %d bytes (MLA %v)",
			c.Name, s.Layers, s.KVHeads, s.HeadDim, s.ElemBytes, s.MLA, want.Layers, want.KVHeads, want.HeadDim, want.ElemBytes, want.MLA)
	case c.QHeads%s.TP != 0:
		return badInput("model %s: %d query heads do not split over TP %d", c.Name, c.QHeads, s.TP)
	case c.Inter%s.TP != 0:
		return badInput("model %s: SwiGLU width %d does not split over TP %d", c.Name, c.Inter, s.TP)
	}
	return nil
}
