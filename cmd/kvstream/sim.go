package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/cuda/driver"
	"github.com/kvstream/kvstream/lab/gpucheck"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
)

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
}

func newSim() *cobra.Command {
	f := &simFlags{cfg: workload.Defaults()}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run a prefill→decode workload per layer and monolithically, check every byte, compare",
		Long: `sim builds a prefill engine and a decode pool in one process (virtual GPU, loopback transport
with a modeled link), runs a batch of requests through chunked prefill forwards, streams their KV
per layer group with kvstream, then runs the same workload with the monolithic post-forward send.
Every owned destination page is compared byte for byte with its source; a mismatch exits non-zero.

Models: ` + presetHelp(),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSim(cmd, f) },
	}
	fl := cmd.Flags()
	addWorkloadFlags(fl, f)
	addShardFlags(fl, &f.cfg, &f.pageOrder)
	fl.BoolVar(&f.jsonOut, "json", false, "print the report as one JSON object")
	fl.StringVar(&f.traceOut, "trace-out", "", "write a Chrome/Perfetto trace-event JSON of both runs")
	fl.StringVar(&f.plotOut, "plot", "", "write a PNG timeline of forward vs transfer for both modes")
	fl.StringVar(&f.record, "record", "", "write the per-layer run's message trace (replay it with kvstream replay)")
	fl.BoolVar(&f.verbose, "verbose", false, "log the engine at DEBUG")
	fl.BoolVar(&f.noProg, "no-progress", false, "no progress bar")
	fl.StringVar(&f.gpu, "gpu", "", "cuda:N: run the engine end to end on a real GPU instead (pool in device memory, kernels and events on a real stream); the virtual GPU is the default")
	f.metrics = addMetricsFlags(cmd)
	return cmd
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

func runSim(cmd *cobra.Command, f *simFlags) (err error) {
	if f.gpu != "" {
		// The GPU run is a fixed check workload (lab/gpucheck): say so
		// rather than ignore a workload flag the user thought applied.
		var unused []string
		cmd.Flags().Visit(func(fl *pflag.Flag) {
			if fl.Name != "gpu" && fl.Name != "no-progress" && fl.Name != "verbose" {
				unused = append(unused, "--"+fl.Name)
			}
		})
		if len(unused) > 0 {
			d := gpucheck.Defaults()
			return errors.Newf("--gpu runs a fixed check workload (%d buffers, %d requests, K = %d) and takes no %s",
				d.Layers, d.Requests, d.GroupSize, strings.Join(unused, ", "))
		}
		return runGPU(cmd, f.gpu)
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	cfg.Timeline = f.traceOut != "" || f.plotOut != ""
	if cfg.Timeline && (cfg.PrefillTP > 0 || cfg.DecodeTP > 0 || cfg.PrefillPP > 0 || cfg.DecodePP > 0) {
		// The timeline has one GPU track and one track per room; several
		// ranks' kernels and finishes would overlap on them.
		return errors.Mark(errors.Newf("--trace-out and --plot draw one prefill rank; a sharded run (--prefill-tp %d --decode-tp %d) has several",
			cfg.PrefillTP, cfg.DecodeTP), system.ErrBadInput)
	}

	level := zap.WarnLevel
	if f.verbose {
		level = zap.DebugLevel
	}
	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.Lock(os.Stderr), level))
	defer log.Sync() //nolint:errcheck

	var bar *progressbar.ProgressBar
	if !f.jsonOut && !f.noProg && term.IsTerminal(int(os.Stderr.Fd())) {
		start := time.Now()
		cfg.Progress = func(done, total int) {
			if bar == nil && time.Since(start) < 2*time.Second {
				return // short runs need no bar
			}
			if bar == nil {
				bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionSetDescription("forwards"),
					progressbar.OptionShowCount(), progressbar.OptionClearOnFinish(), progressbar.OptionThrottle(100*time.Millisecond))
			}
			_ = bar.Set(done)
		}
	}
	reg, stopMetrics, err := f.metrics.start()
	defer stopMetrics()
	if err != nil {
		return err
	}
	if reg != nil {
		// One registry for both runs, which add up (docs/OBSERVABILITY.md,
		// "Scraping the CLI"): a label per run would be a label no other
		// command has and no dashboard expects; the runs' modes are told
		// apart by kvstream_registrations_total's mode.
		cfg.EngineOptions = append(cfg.EngineOptions, system.WithMetrics(reg))
	}
	if f.record != "" {
		fh, err := os.Create(f.record)
		if err != nil {
			return errors.Wrap(err, "--record")
		}
		defer func() {
			if cerr := fh.Close(); cerr != nil && err == nil {
				err = errors.Wrap(cerr, "--record")
			}
		}()
		cfg.Record = fh // written when the per-layer engine closes
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := workload.Run(ctx, cfg, log)
	if bar != nil {
		_ = bar.Finish()
	}
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if f.jsonOut {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.Text(out)
		printKeyMetrics(out, reg)
	}
	if f.traceOut != "" {
		if err := writeFile(f.traceOut, rep.WriteTrace); err != nil {
			return errors.Wrap(err, "--trace-out")
		}
	}
	if f.plotOut != "" {
		if err := writeFile(f.plotOut, rep.WritePNG); err != nil {
			return errors.Wrap(err, "--plot")
		}
	}
	if !rep.BytesEqual {
		return errors.Newf("bytes differ: %s", rep.Mismatch)
	}
	if len(rep.OracleFailures) > 0 {
		return errors.Newf("the transfer oracle failed: %s", strings.Join(rep.OracleFailures, "; "))
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

// runGPU runs the engine end to end on a real GPU (lab/gpucheck).
func runGPU(cmd *cobra.Command, spec string) error {
	n, err := strconv.Atoi(strings.TrimPrefix(spec, "cuda:"))
	if !strings.HasPrefix(spec, "cuda:") || err != nil || n < 0 {
		return errors.Newf("--gpu %q: want cuda:N, for example cuda:0", spec)
	}
	dev, err := driver.Open(n)
	if err != nil {
		return errors.Wrapf(err, "--gpu %s (the virtual GPU needs no flag)", spec)
	}
	defer dev.Close()
	rep, err := gpucheck.Run(cmd.Context(), dev, gpucheck.Defaults())
	if err != nil {
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), rep)
	if !rep.BytesEqual {
		return errors.Newf("bytes differ: %s", rep.Mismatch)
	}
	return nil
}
