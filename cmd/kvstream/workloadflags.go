package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"github.com/spf13/pflag"
)

// simFlags are the sim workload's flags, shared by sim, prefill,
// prefill-rank and up.
type simFlags struct {
	gpu                       string
	metrics                   *metricsFlags
	model, cpRule             string
	cfg                       workload.Config
	jsonOut, verbose, noProg  bool
	traceOut, plotOut, record string
	linkLatencyUs             float64
	pageOrder                 string
	group                     string // --group: K, or auto
	fault                     string // --fault KIND:RATE (sim only)
}

// addWorkloadFlags declares the workload's flags (sim, prefill).
func addWorkloadFlags(fl *pflag.FlagSet, f *simFlags) {
	d := workload.Defaults()
	fl.StringVar(&f.model, "model", d.Preset.Name, "model preset: "+strings.Join(workload.PresetNames(), ", "))
	fl.IntVar(&f.cfg.Layers, "layers", 0, "hook layers (0: the preset's; dsv3 with 78 gives 78 hooks over 79 buffers)")
	fl.IntVar(&f.cfg.Requests, "requests", d.Requests, "requests in the batch")
	fl.IntVar(&f.cfg.PromptTokens, "prompt-tokens", d.PromptTokens, "prompt length of every request")
	fl.IntVar(&f.cfg.Resident, "resident", 0, "requests whose KV pages the pools hold at once; a request takes a finished one's pages (0: four forwards' worth, at most --requests)")
	fl.IntVar(&f.cfg.ChunkTokens, "chunk-tokens", d.ChunkTokens, "token budget of one forward (chunked prefill)")
	fl.IntVar(&f.cfg.PageSize, "page-size", d.PageSize, "tokens per page")
	fl.StringVar(&f.group, "group", strconv.Itoa(d.GroupSize), "layers per submit (K), or auto: the engine chooses K from the link, the compute model and the chunk (sim only)")
	fl.IntVar(&f.cfg.Submitters, "submitters", d.Submitters, "submitter actors")
	fl.Float64Var(&f.cfg.LinkGbps, "link-gbps", d.LinkGbps, "modeled link rate, Gb/s")
	fl.Float64Var(&f.linkLatencyUs, "link-latency-us", float64(d.LinkLatency/time.Microsecond), "modeled per-batch link latency, µs")
	fl.IntVar(&f.cfg.CP.Size, "cp", 1, "context-parallel size")
	fl.IntVar(&f.cfg.CP.Rank, "cp-rank", 0, "this engine's CP rank")
	fl.StringVar(&f.cpRule, "cp-rule", "shared", "CP page rule: shared (position % cp) or contiguous")
	fl.IntVar(&f.cfg.Scale, "scale", 0, "divide bytes per page by this (0: fit --memory-mib); page, block and message counts stay real")
	fl.Int64Var(&f.cfg.MemoryBudget, "memory-mib", d.MemoryBudget>>20, "memory for one KV pool when --scale is 0, MiB")
	fl.Float64Var(&f.cfg.TimeScale, "time-scale", d.TimeScale, "run modeled time this many times faster than wall time")
	fl.Float64Var(&f.cfg.LayerUsPerKTok, "layer-us-per-ktok", 0, "modeled compute per layer per 1000 tokens of a forward, µs (0: the preset's)")
	fl.DurationVar(&f.cfg.FinishTimeout, "finish-timeout", d.FinishTimeout, "bound of each Finish")
	fl.Uint64Var(&f.cfg.Seed, "seed", d.Seed, "seed of the page allocation and the KV bytes")
}

// addShardFlags declares the sharding flags (sim, prefill, decode).
func addShardFlags(fl *pflag.FlagSet, cfg *workload.Config, pageOrder *string) {
	fl.IntVar(&cfg.PrefillTP, "prefill-tp", 0, "prefill TP degree: one engine per rank, the KV resharded to --decode-tp (0 with --decode-tp 0: one engine, unsharded)")
	fl.IntVar(&cfg.DecodeTP, "decode-tp", 0, "decode TP degree: one decode pool per rank (0: 1 when --prefill-tp is set)")
	fl.IntVar(&cfg.PrefillPP, "prefill-pp", 0, "prefill PP stages (layers split evenly): one engine per stage and TP rank (0: one stage)")
	fl.IntVar(&cfg.DecodePP, "decode-pp", 0, "decode PP stages (layers split evenly): one decode pool per stage and TP rank (0: one stage)")
	fl.StringVar(pageOrder, "page-order", "head-major", "page layout of both sides when sharded: head-major ([head][token][dim], one write per head slice) or token-major ([token][head][dim], page-size writes per head slice)")
}

// parsePageOrder reads --page-order.
func parsePageOrder(s string) (reshard.Order, error) {
	switch s {
	case "", reshard.HeadMajor.String(): // commands without --page-order share this config
		return reshard.HeadMajor, nil
	case reshard.TokenMajor.String():
		return reshard.TokenMajor, nil
	}
	return 0, errors.Mark(errors.Newf("--page-order %q: want head-major or token-major", s), system.ErrBadInput)
}

func presetHelp() string {
	var b strings.Builder
	for _, n := range workload.PresetNames() {
		fmt.Fprintf(&b, "\n  %-9s %s", n, workload.Presets[n].Description)
	}
	return b.String()
}

// config turns the flags into a workload configuration, naming a bad value.
func (f *simFlags) config() (workload.Config, error) {
	cfg := f.cfg
	p, ok := workload.Presets[f.model]
	if !ok {
		return cfg, errors.Newf("--model %q: want one of %s", f.model, strings.Join(workload.PresetNames(), ", "))
	}
	cfg.Preset = p
	rule, err := cp.ParseRule(f.cpRule)
	if err != nil {
		return cfg, errors.Wrap(err, "--cp-rule")
	}
	cfg.CP.Rule = rule
	switch k, err := strconv.Atoi(f.group); {
	case f.group == "auto":
		cfg.GroupSize, cfg.AutoGroup = 0, true
	case f.group == "":
		// Commands that declare no --group keep the default.
	case err != nil:
		return cfg, errors.Newf("--group %q: want a number of layers or auto", f.group)
	default:
		cfg.GroupSize = k
	}
	if cfg.PageOrder, err = parsePageOrder(f.pageOrder); err != nil {
		return cfg, err
	}
	// Converted here, so checked here: a shift or a float-to-duration
	// conversion of a wild value would wrap before workload's bounds see it.
	if cfg.MemoryBudget < 0 || cfg.MemoryBudget > workload.MaxMemoryBudget>>20 {
		return cfg, errors.Newf("--memory-mib %d: must be within [0, %d]", cfg.MemoryBudget, workload.MaxMemoryBudget>>20)
	}
	cfg.MemoryBudget <<= 20
	maxUs := float64(workload.MaxLatency / time.Microsecond)
	if !(f.linkLatencyUs >= 0 && f.linkLatencyUs <= maxUs) { // NaN fails both
		return cfg, errors.Newf("--link-latency-us %v: must be within [0, %v]", f.linkLatencyUs, maxUs)
	}
	cfg.LinkLatency = time.Duration(f.linkLatencyUs * float64(time.Microsecond))
	return cfg, nil
}

// workloadFlagNames are the names addWorkloadFlags declares.
func workloadFlagNames() []string {
	names := pflag.NewFlagSet("workload", pflag.ContinueOnError)
	addWorkloadFlags(names, &simFlags{})
	var out []string
	names.VisitAll(func(f *pflag.Flag) { out = append(out, f.Name) })
	return out
}
