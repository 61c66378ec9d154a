package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda/driver"
	"github.com/kvstream/kvstream/lab/gpucheck"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
)

// newSim is `kvstream sim`: its flags over workload.Run (or, with --gpu,
// gpucheck.Run).
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
	fl.StringVar(&f.fault, "fault", "", "KIND:RATE: inject transport faults into the prefill transport, RATE a probability per batch (endpoint-broken:0.05: the connection breaks mid-batch and the engine resumes on a fresh endpoint; lost-completion:0.05: the batch lands but its completion never comes, and the engine re-sends it at its completion deadline, a quarter of --finish-timeout); the report counts faults, groups re-sent and chunks failed per mode")
	fl.StringVar(&f.gpu, "gpu", "", "cuda:N: run the engine end to end on a real GPU instead (pool in device memory, kernels and events on a real stream); the virtual GPU is the default")
	f.metrics = addMetricsFlags(cmd)
	return cmd
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
	// The files are written after the run: a directory that is not there
	// fails now, not after the whole run.
	for _, out := range []struct{ flag, path string }{{"--trace-out", f.traceOut}, {"--plot", f.plotOut}, {"--record", f.record}} {
		if err := checkOutputDir(out.flag, out.path); err != nil {
			return err
		}
	}
	if f.fault != "" {
		if cfg.Fault, err = workload.ParseFault("--fault", f.fault); err != nil {
			return err
		}
	}
	cfg.Timeline = f.traceOut != "" || f.plotOut != ""
	if cfg.Timeline && (cfg.PrefillTP > 0 || cfg.DecodeTP > 0 || cfg.PrefillPP > 0 || cfg.DecodePP > 0) {
		// The timeline has one GPU track and one track per room; several
		// ranks' kernels and finishes would overlap on them.
		return errors.Mark(errors.Newf("--trace-out and --plot draw one prefill rank; a sharded run (--prefill-tp %d --decode-tp %d) has several",
			cfg.PrefillTP, cfg.DecodeTP), system.ErrBadInput)
	}

	log := cliLogger(cmd, f.verbose)
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
	if err := printReport(cmd.OutOrStdout(), f.jsonOut, rep, func(w io.Writer) { printKeyMetrics(w, reg) }); err != nil {
		return err
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

// checkOutputDir refuses an output file (flag's value path) whose
// directory does not exist or is not a directory ("" is no file).
func checkOutputDir(flag, path string) error {
	if path == "" {
		return nil
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case err != nil && errors.Is(err, fs.ErrNotExist):
		return errors.Newf("%s %q: directory %q does not exist", flag, path, dir)
	case err != nil:
		return errors.Wrapf(err, "%s %q", flag, path)
	case !st.IsDir():
		return errors.Newf("%s %q: %q is not a directory", flag, path, dir)
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
