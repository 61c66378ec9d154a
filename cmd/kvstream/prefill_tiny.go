package main

import (
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/generate"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/system"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// kvstream prefill --model tiny-gqa|tiny-mla: newPrefill routes the tiny
// models here.

// tinyFlags are the prefill's flags that only a tiny model takes.
type tinyFlags struct {
	newTokens int
	plant     string
}

func (t *tinyFlags) add(fl *pflag.FlagSet) {
	d := generate.Defaults()
	fl.IntVar(&t.newTokens, "new-tokens", d.NewTokens, "tiny models: tokens the decode process decodes after the first, per room")
	fl.StringVar(&t.plant, "plant", "none", "tiny models: commit a production bug on purpose: none, chunk-positions, rope-offset, hookless-not-sent")
}

// unused refuses the tiny models' flags for a sim model.
func (t *tinyFlags) unused(cmd *cobra.Command) error {
	for _, name := range []string{"new-tokens", "plant"} {
		if cmd.Flags().Changed(name) {
			return errors.Newf("--%s applies to the tiny models (--model %s)", name, strings.Join(tinylm.PresetNames(), ", "))
		}
	}
	return nil
}

// simOnlyFlags are the prefill's flags that describe the sim's model, its
// modeled GPU or link, or its residency: a tiny model takes none.
var simOnlyFlags = []string{"layers", "resident", "link-gbps", "link-latency-us", "cp-rank", "scale", "memory-mib",
	"time-scale", "layer-us-per-ktok"}

// config is the tiny run the flags ask for: kvstream generate's defaults,
// with the flags given.
func (t *tinyFlags) config(cmd *cobra.Command, f *simFlags) (generate.Config, int, error) {
	cfg := generate.Defaults()
	var unused []string
	for _, name := range simOnlyFlags {
		if cmd.Flags().Changed(name) {
			unused = append(unused, "--"+name)
		}
	}
	if len(unused) > 0 {
		return cfg, 0, errors.Newf("--model %s runs on CPU streams over a real link and takes no %s", f.model, strings.Join(unused, ", "))
	}
	var err error
	if cfg.Model, err = tinylm.Preset(f.model); err != nil {
		return cfg, 0, err
	}
	requests := 1
	changed := cmd.Flags().Changed
	for _, v := range []struct {
		flag string
		dst  *int
		val  int
	}{
		{"requests", &requests, f.cfg.Requests}, {"prompt-tokens", &cfg.PromptTokens, f.cfg.PromptTokens},
		{"chunk-tokens", &cfg.ChunkTokens, f.cfg.ChunkTokens}, {"page-size", &cfg.PageSize, f.cfg.PageSize},
		{"group", &cfg.GroupSize, f.cfg.GroupSize}, {"submitters", &cfg.Submitters, f.cfg.Submitters}, {"cp", &cfg.CP, f.cfg.CP.Size},
		{"prefill-tp", &cfg.PrefillTP, f.cfg.PrefillTP}, {"decode-tp", &cfg.DecodeTP, f.cfg.DecodeTP},
		{"prefill-pp", &cfg.PrefillPP, f.cfg.PrefillPP}, {"decode-pp", &cfg.DecodePP, f.cfg.DecodePP},
	} {
		if changed(v.flag) {
			*v.dst = v.val
		}
	}
	if changed("finish-timeout") {
		cfg.FinishTimeout = f.cfg.FinishTimeout
	}
	if changed("seed") {
		cfg.Seed = f.cfg.Seed
	}
	cfg.NewTokens = t.newTokens
	if cfg.CPRule, err = cp.ParseRule(f.cpRule); err != nil {
		return cfg, 0, errors.Mark(errors.Wrap(err, "--cp-rule"), system.ErrBadInput)
	}
	if cfg.PageOrder, err = parsePageOrder(f.pageOrder); err != nil {
		return cfg, 0, err
	}
	if cfg.Plant, err = generate.ParsePlant(t.plant); err != nil {
		return cfg, 0, err
	}
	return cfg, requests, nil
}

// runTinyPrefill is kvstream prefill for a tiny model: its flags over
// simsession.RunTinyPrefillProcess.
func runTinyPrefill(cmd *cobra.Command, f *simFlags, t *tinyFlags, nf *netFlags, decodeAddr, decodeName, transport string,
	connect time.Duration, monolithic bool) (err error) {
	cfg, requests, err := t.config(cmd, f)
	if err != nil {
		return err
	}
	if err := generate.CheckRemote(cfg, requests); err != nil {
		return err
	}
	if err := checkHostPort("--decode", decodeAddr, false); err != nil {
		return err
	}
	switch {
	case decodeName == "":
		return errors.New("--decode-name is empty: the name the decode's certificate carries")
	case connect < 0:
		return errors.Newf("--connect-timeout %v: must not be negative", connect)
	}
	tlsm, err := nf.check("prefill")
	if err != nil {
		return err
	}
	if err := refuseLoopback("prefill", transport); err != nil {
		return err
	}
	log := cliLogger(cmd, f.verbose)
	defer log.Sync() //nolint:errcheck
	pl, err := nf.open(tlsm, log, transport, "prefill")
	if err != nil {
		return err
	}
	defer pl.close(&err)
	return simsession.RunTinyPrefillProcess(simsession.TinyPrefillProcessConfig{
		Generate: cfg, Requests: requests, Dial: decode.DialConfig{Decode: decodeAddr, DecodeName: decodeName, ConnectTimeout: connect},
		Node: pl.node, Transport: pl.tr, TransportName: transport, Monolithic: monolithic, Out: cmd.OutOrStdout(), Log: log,
	})
}
