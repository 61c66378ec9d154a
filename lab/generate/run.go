package generate

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvstream/kvstream/lab/tinylm"
	"go.uber.org/zap"
)

// ModeReport is one transfer mode's outcome.
type ModeReport struct {
	// Tokens were decoded from the KV this mode transferred.
	Tokens []int `json:"tokens"`
	// TokensEqual: they are the reference's (the collocated decode's),
	// logits within tolerance.
	TokensEqual bool `json:"tokens_equal"`
	// FirstDiff is the first step whose token differs (-1: none).
	FirstDiff int `json:"first_diff"`
	// MaxLogitDiff against the reference, over the steps decoded from the
	// same inputs.
	MaxLogitDiff float64 `json:"max_logit_diff"`
	// BytesEqual: every decode byte is the whole-tensor reshard of the
	// prefill's; Mismatch names the first that is not.
	BytesEqual bool   `json:"bytes_equal"`
	Mismatch   string `json:"mismatch,omitempty"`
	// Transport is what the transport oracle caught (lab/landguard): a
	// SUCCESS before the chunk's bytes landed, a batch after it, a chunk
	// whose bytes posted are not what its decode pages hold, once.
	Transport []string `json:"transport_violations,omitempty"`
	// ForwardMs is the request's prefill on the CPU streams, its first
	// kernel's start to its last kernel's end.
	ForwardMs float64 `json:"forward_ms"`
	// ExposedMs is the request's last Finish return minus the end of its
	// last forward; FloorMs the ideal sender's on the same timeline.
	ExposedMs    float64 `json:"exposed_ms"`
	FloorMs      float64 `json:"floor_ms"`
	RatioToFloor float64 `json:"ratio_to_floor"`
	// Phases split the exposed time.
	Phases Phases `json:"exposed_phases"`
	// Bytes and Batches the request's chunks posted, over every rank.
	Bytes   uint64 `json:"bytes"`
	Batches int    `json:"batches"`
}

// Report is a generate run's outcome.
type Report struct {
	Model        string  `json:"model"`
	PromptTokens int     `json:"prompt_tokens"`
	NewTokens    int     `json:"new_tokens"`
	ChunkTokens  int     `json:"chunk_tokens"`
	PageSize     int     `json:"page_size"`
	Group        int     `json:"group"`
	CP           int     `json:"cp"`
	PrefillTP    int     `json:"prefill_tp"`
	DecodeTP     int     `json:"decode_tp"`
	PrefillPP    int     `json:"prefill_pp"`
	DecodePP     int     `json:"decode_pp"`
	PageOrder    string  `json:"page_order"`
	LinkGbps     float64 `json:"link_gbps"`
	Plant        string  `json:"plant,omitempty"`

	// TokensEqual: every mode's tokens are the reference's, the
	// reference's are the model's own, the prefill's first token is the
	// model's, and every logit difference is within LogitTolerance.
	TokensEqual bool `json:"tokens_equal"`
	// FirstToken is the prefill's pick, fed to every decode;
	// ModelFirstToken the model's own.
	FirstToken      int `json:"first_token"`
	ModelFirstToken int `json:"model_first_token"`
	// Tokens were decoded from the KV streamed per layer group.
	Tokens []int `json:"tokens"`
	// ReferenceTokens were decoded collocated from the prefill's own pools.
	ReferenceTokens []int `json:"reference_tokens"`
	// ModelTokens are the model's on its own (one forward, one rank, no
	// transfer).
	ModelTokens []int `json:"model_tokens"`
	// MaxLogitDiff is the largest logit difference of any comparison (each
	// mode against the reference, the reference against the model).
	MaxLogitDiff   float64 `json:"max_logit_diff"`
	LogitTolerance float64 `json:"logit_tolerance"`
	// MinTop1Margin is the smallest top-1 margin of any decode's pick.
	MinTop1Margin float64 `json:"min_top1_margin"`
	// BytesEqual: every mode's bytes are equal.
	BytesEqual bool `json:"bytes_equal"`
	// TransportOK: the transport oracle caught nothing in any mode.
	TransportOK bool `json:"transport_ok"`

	PerLayer   *ModeReport `json:"per_layer"`
	Monolithic *ModeReport `json:"monolithic,omitempty"`

	WallSeconds float64 `json:"wall_seconds"`
}

// Run runs the configuration: the model's own generation, then per layer
// (and monolithic) transfers, each decoded, the per-layer run's prefill
// pools also decoded collocated.
func Run(ctx context.Context, cfg Config, log *zap.Logger) (*Report, error) {
	t0 := time.Now()
	g, err := cfg.check()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	m, err := tinylm.New(cfg.Model)
	if err != nil {
		return nil, err
	}
	r, err := newRig(cfg, g, m, log)
	if err != nil {
		return nil, err
	}
	prompt := m.Prompt(cfg.Seed, cfg.PromptTokens)
	modelFirst, model, err := m.Reference(prompt, cfg.NewTokens)
	if err != nil {
		return nil, err
	}
	reqs := []request{{room: 1, prompt: prompt, dst: r.dst}}
	if cfg.Plant == PlantStalePage {
		// The previous request: another prompt on the same pages.
		reqs = []request{{room: 1, prompt: m.Prompt(cfg.Seed+1, cfg.PromptTokens), dst: r.dst}, {room: stalePlantRoom, prompt: prompt, dst: r.dst}}
	}

	rep := &Report{Model: cfg.Model.Name, PromptTokens: cfg.PromptTokens, NewTokens: cfg.NewTokens, ChunkTokens: cfg.ChunkTokens,
		PageSize: cfg.PageSize, Group: cfg.GroupSize, CP: cfg.CP, PrefillTP: g.pre.TP, DecodeTP: g.dec.TP,
		PrefillPP: g.pre.PP(), DecodePP: g.dec.PP(), PageOrder: cfg.PageOrder.String(), LinkGbps: cfg.LinkGbps,
		LogitTolerance: tinylm.LogitTolerance, ModelTokens: model.Tokens(), ModelFirstToken: modelFirst.Token, BytesEqual: true, TokensEqual: true, TransportOK: true}
	if cfg.Plant != NoPlant {
		rep.Plant = cfg.Plant.String()
	}
	margin := min(modelFirst.Margin, model.MinMargin())
	var ref *tinylm.Generation
	modes := []bool{true}
	if cfg.Monolithic {
		modes = append(modes, false)
	}
	for _, perLayer := range modes {
		mr, err := r.runMode(ctx, perLayer, perLayer, reqs)
		if err != nil {
			return nil, err
		}
		if perLayer {
			ref = mr.ref
			rep.FirstToken = mr.first.Token
			rep.ReferenceTokens = ref.Tokens()
			margin = min(margin, mr.first.Margin, ref.MinMargin())
			vsModel := tinylm.Compare(ref, &model)
			rep.TokensEqual = vsModel.Equal && mr.first.Token == modelFirst.Token
			rep.MaxLogitDiff = vsModel.MaxLogitDiff
		}
		cmp := tinylm.Compare(&mr.gen, ref)
		mrep := &ModeReport{Tokens: mr.gen.Tokens(), TokensEqual: cmp.Equal && cmp.MaxLogitDiff <= tinylm.LogitTolerance,
			FirstDiff: cmp.FirstDiff, MaxLogitDiff: cmp.MaxLogitDiff, BytesEqual: mr.bytesEqual, Mismatch: mr.mismatch, Transport: mr.transport,
			ForwardMs: ms(mr.forward), ExposedMs: ms(mr.exposed), FloorMs: ms(mr.floor), Phases: mr.phases, Bytes: mr.bytes, Batches: mr.batches}
		if mr.floor > 0 {
			mrep.RatioToFloor = float64(mr.exposed) / float64(mr.floor)
		}
		margin = min(margin, mr.gen.MinMargin())
		rep.MaxLogitDiff = max(rep.MaxLogitDiff, cmp.MaxLogitDiff)
		rep.TokensEqual = rep.TokensEqual && mrep.TokensEqual
		rep.BytesEqual = rep.BytesEqual && mr.bytesEqual
		rep.TransportOK = rep.TransportOK && len(mr.transport) == 0
		if perLayer {
			rep.PerLayer, rep.Tokens = mrep, mrep.Tokens
		} else {
			rep.Monolithic = mrep
		}
	}
	rep.TokensEqual = rep.TokensEqual && rep.MaxLogitDiff <= tinylm.LogitTolerance
	rep.MinTop1Margin = margin
	rep.WallSeconds = time.Since(t0).Seconds()
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// OK reports whether tokens and bytes are equal and the transport oracle
// caught nothing.
func (r *Report) OK() bool { return r.TokensEqual && r.BytesEqual && r.TransportOK }

// Text writes the report for people.
func (r *Report) Text(w io.Writer) {
	fmt.Fprintf(w, "%s: %d prompt tokens in chunks of %d, page %d, K = %d, CP %d, prefill TP %d PP %d -> decode TP %d PP %d, %s, link %g Gb/s\n",
		r.Model, r.PromptTokens, r.ChunkTokens, r.PageSize, r.Group, r.CP, r.PrefillTP, r.PrefillPP, r.DecodeTP, r.DecodePP, r.PageOrder, r.LinkGbps)
	if r.Plant != "" {
		fmt.Fprintf(w, "planted bug: %s\n", r.Plant)
	}
	fmt.Fprintf(w, "first token: %d from the prefill, %d from the model\n", r.FirstToken, r.ModelFirstToken)
	row := func(name string, toks []int) { fmt.Fprintf(w, "%-28s %s\n", name, ints(toks)) }
	row("tokens (per layer)", r.Tokens)
	if r.Monolithic != nil {
		row("tokens (monolithic)", r.Monolithic.Tokens)
	}
	row("reference (collocated)", r.ReferenceTokens)
	row("model (on its own)", r.ModelTokens)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%36s %14s %14s\n", "", "per-layer", "monolithic")
	cell := func(f func(*ModeReport) string) string {
		if r.Monolithic == nil {
			return fmt.Sprintf("%14s %14s", f(r.PerLayer), "-")
		}
		return fmt.Sprintf("%14s %14s", f(r.PerLayer), f(r.Monolithic))
	}
	fmt.Fprintf(w, "%36s %s\n", "prefill forward on CPU (ms)", cell(func(m *ModeReport) string { return fmt.Sprintf("%.2f", m.ForwardMs) }))
	fmt.Fprintf(w, "%36s %s\n", "exposed transfer (ms)", cell(func(m *ModeReport) string { return fmt.Sprintf("%.3f", m.ExposedMs) }))
	fmt.Fprintf(w, "%36s %s\n", "ideal floor (ms)", cell(func(m *ModeReport) string { return fmt.Sprintf("%.3f", m.FloorMs) }))
	fmt.Fprintf(w, "%36s %s\n", "exposed / floor", cell(func(m *ModeReport) string { return fmt.Sprintf("%.2f", m.RatioToFloor) }))
	fmt.Fprintf(w, "%36s %s\n", "exposed phase detect (ms)", cell(func(m *ModeReport) string { return fmt.Sprintf("%.3f", m.Phases.DetectMs) }))
	fmt.Fprintf(w, "%36s %s\n", "exposed phase post (ms)", cell(func(m *ModeReport) string { return fmt.Sprintf("%.3f", m.Phases.PostMs) }))
	fmt.Fprintf(w, "%36s %s\n", "exposed phase land (ms)", cell(func(m *ModeReport) string { return fmt.Sprintf("%.3f", m.Phases.LandMs) }))
	fmt.Fprintf(w, "%36s %s\n", "exposed phase finish (ms)", cell(func(m *ModeReport) string { return fmt.Sprintf("%.3f", m.Phases.FinishMs) }))
	fmt.Fprintf(w, "%36s %s\n", "bytes posted", cell(func(m *ModeReport) string { return fmt.Sprint(m.Bytes) }))
	fmt.Fprintf(w, "%36s %s\n", "batches", cell(func(m *ModeReport) string { return fmt.Sprint(m.Batches) }))
	fmt.Fprintln(w)
	fmt.Fprintf(w, "max_logit_diff: %.3g (tolerance %g)\n", r.MaxLogitDiff, r.LogitTolerance)
	fmt.Fprintf(w, "min_top1_margin: %.3g\n", r.MinTop1Margin)
	for _, m := range []*ModeReport{r.PerLayer, r.Monolithic} {
		if m != nil && m.Mismatch != "" {
			fmt.Fprintf(w, "bytes differ: %s\n", m.Mismatch)
		}
	}
	for _, m := range []*ModeReport{r.PerLayer, r.Monolithic} {
		if m == nil {
			continue
		}
		for i, v := range m.Transport {
			if i == 3 {
				fmt.Fprintf(w, "transport: ... and %d more\n", len(m.Transport)-i)
				break
			}
			fmt.Fprintf(w, "transport: %s\n", v)
		}
	}
	fmt.Fprintf(w, "bytes_equal: %v\n", r.BytesEqual)
	fmt.Fprintf(w, "transport_ok: %v\n", r.TransportOK)
	fmt.Fprintf(w, "tokens_equal: %v\n", r.TokensEqual)
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, " ")
}
