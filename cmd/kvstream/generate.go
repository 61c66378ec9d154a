package main

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/lab/generate"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/system"
	"github.com/spf13/cobra"
)

type generateFlags struct {
	cfg                  generate.Config
	model, cpRule, order string
	plant                string
	linkLatencyUs        float64
	jsonOut, verbose     bool
}

func newGenerate() *cobra.Command {
	d := generate.Defaults()
	f := &generateFlags{cfg: d}
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Prefill a small transformer, stream its KV, decode tokens from it and compare them",
		Long: `generate is a real client of the engine: a small transformer (pure Go, weights from a seed)
prefills a prompt in chunks on CPU compute streams, one engine per prefill rank writing each layer's
KV into paged pools and calling LayerEnd after it; the KV streams per layer group (then, for
comparison, monolithically) over the loopback fabric into decode pools sharded the decode side's way;
the decode greedily generates --new-tokens reading its KV only from those pools, each decode TP rank
over its own heads. Its tokens must equal the same decode collocated on the prefill's own pools and
the model's own generation (logits within a float tolerance); every decode byte is also checked
against the prefill's. It exits non-zero when tokens or bytes differ.

Timing is real compute: it reports each mode's exposed transfer against the ideal floor on the same
timeline. Models: ` + strings.Join(tinylm.PresetNames(), ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runGenerate(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.model, "model", d.Model.Name, "model: "+strings.Join(tinylm.PresetNames(), ", "))
	fl.IntVar(&f.cfg.PromptTokens, "prompt-tokens", d.PromptTokens, "prompt length")
	fl.IntVar(&f.cfg.NewTokens, "new-tokens", d.NewTokens, "tokens to decode after the prefill's first")
	fl.IntVar(&f.cfg.ChunkTokens, "chunk-tokens", d.ChunkTokens, "token budget of one forward (chunked prefill)")
	fl.IntVar(&f.cfg.PageSize, "page-size", d.PageSize, "tokens per page")
	fl.IntVar(&f.cfg.GroupSize, "group", d.GroupSize, "layers per submit (K)")
	fl.IntVar(&f.cfg.CP, "cp", d.CP, "prefill context-parallel size: one engine per CP rank, each sending the pages it owns")
	fl.StringVar(&f.cpRule, "cp-rule", d.CPRule.String(), "CP page rule: shared (position % cp) or contiguous")
	fl.IntVar(&f.cfg.PrefillTP, "prefill-tp", 1, "prefill TP degree: one engine per rank")
	fl.IntVar(&f.cfg.DecodeTP, "decode-tp", 1, "decode TP degree: one decode pool per rank, each attending over its own heads")
	fl.IntVar(&f.cfg.PrefillPP, "prefill-pp", 1, "prefill PP stages (layers split evenly): one engine and CPU stream per stage")
	fl.IntVar(&f.cfg.DecodePP, "decode-pp", 1, "decode PP stages (layers split evenly)")
	fl.StringVar(&f.order, "page-order", d.PageOrder.String(), "page layout of both sides: head-major or token-major")
	fl.Float64Var(&f.cfg.LinkGbps, "link-gbps", d.LinkGbps, "modeled link rate of each prefill rank, Gb/s")
	fl.Float64Var(&f.linkLatencyUs, "link-latency-us", float64(d.LinkLatency/time.Microsecond), "modeled per-batch link latency, µs")
	fl.Uint64Var(&f.cfg.Seed, "seed", d.Seed, "seed of the prompt and the page tables")
	fl.DurationVar(&f.cfg.FinishTimeout, "finish-timeout", d.FinishTimeout, "bound of each Finish")
	fl.BoolVar(&f.cfg.Monolithic, "monolithic", d.Monolithic, "also run the monolithic send for comparison")
	fl.StringVar(&f.plant, "plant", "none", "commit a production bug on purpose, to see what catches it: "+strings.Join(plantNames(), ", "))
	fl.BoolVar(&f.jsonOut, "json", false, "print the report as one JSON object")
	fl.BoolVar(&f.verbose, "verbose", false, "log the engines at DEBUG")
	return cmd
}

func plantNames() []string {
	var out []string
	for _, p := range generate.Plants() {
		out = append(out, p.String())
	}
	return out
}

// config turns the flags into a run's configuration, naming a bad value.
func (f *generateFlags) config() (generate.Config, error) {
	cfg := f.cfg
	m, err := tinylm.Preset(f.model)
	if err != nil {
		return cfg, errors.Mark(errors.Wrap(err, "--model"), system.ErrBadInput)
	}
	cfg.Model = m
	if cfg.CPRule, err = cp.ParseRule(f.cpRule); err != nil {
		return cfg, errors.Mark(errors.Wrap(err, "--cp-rule"), system.ErrBadInput)
	}
	if cfg.PageOrder, err = parsePageOrder(f.order); err != nil {
		return cfg, err
	}
	if !(f.linkLatencyUs >= 0 && f.linkLatencyUs <= 1e6) { // NaN fails both
		return cfg, errors.Mark(errors.Newf("--link-latency-us %v: must be within [0, 1e6]", f.linkLatencyUs), system.ErrBadInput)
	}
	cfg.LinkLatency = time.Duration(f.linkLatencyUs * float64(time.Microsecond))
	if cfg.Plant, err = generate.ParsePlant(f.plant); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func runGenerate(cmd *cobra.Command, f *generateFlags) error {
	cfg, err := f.config()
	if err != nil {
		return err
	}
	log := cliLogger(cmd, f.verbose)
	defer log.Sync() //nolint:errcheck
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := generate.Run(ctx, cfg, log)
	if err != nil {
		return err
	}
	if err := printReport(cmd.OutOrStdout(), f.jsonOut, rep); err != nil {
		return err
	}
	switch {
	case !rep.BytesEqual && !rep.TokensEqual:
		return errors.New("tokens and bytes differ")
	case !rep.TokensEqual:
		return errors.New("tokens differ")
	case !rep.BytesEqual:
		return errors.New("bytes differ")
	case !rep.TransportOK:
		return errors.New("the transport oracle caught what the bytes do not show (the transport: lines)")
	}
	return nil
}
