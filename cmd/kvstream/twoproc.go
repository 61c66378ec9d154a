package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/twoproc"
	"github.com/kvstream/kvstream/internal/workload"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func cliLogger(verbose bool) *zap.Logger {
	level := zap.WarnLevel
	if verbose {
		level = zap.DebugLevel
	}
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.Lock(os.Stderr), level))
}

func newDecode() *cobra.Command {
	var listen, transport string
	var wait time.Duration
	var verbose bool
	cmd := &cobra.Command{
		Use:   "decode",
		Short: "Serve a decode pool to one prefill process over a real transport, and verify every page",
		Long: `decode listens for one prefill process (kvstream prefill --decode HOST:PORT) on the control plane
(protoactor-go remote, gRPC), allocates a pool of the prefill's geometry, registers it with the
transport (UCX: the prefill writes into it directly), and verifies every page of every chunk the
prefill reports finished against the model's bytes. It prints one summary line and exits 0 only when
every chunk succeeded and every byte matched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := cliLogger(verbose)
			defer log.Sync() //nolint:errcheck
			tr, err := openTransport(transport, "decode")
			if err != nil {
				return err
			}
			defer tr.Close()
			d, err := twoproc.StartDecode(listen, tr, log)
			if err != nil {
				return err
			}
			defer d.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "decode: listening on %s (transport %s)\n", d.Addr(), transport)
			s, err := d.Wait(wait)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s)
			if !s.OK() {
				return errors.New("decode: the session did not end with every chunk successful and every byte equal")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&listen, "listen", "127.0.0.1:9100", "control-plane address (host:port; port 0 picks one)")
	fl.StringVar(&transport, "transport", "ucx", "data transport: ucx (loopback does not cross processes)")
	fl.DurationVar(&wait, "wait", time.Hour, "give up when no prefill session ended within this")
	fl.BoolVar(&verbose, "verbose", false, "log at DEBUG")
	return cmd
}

func newPrefill() *cobra.Command {
	f := &simFlags{cfg: workload.Defaults()}
	var decodeAddr, listen, transport string
	var monolithic bool
	cmd := &cobra.Command{
		Use:   "prefill",
		Short: "Run the sim workload with its data over a real transport into a decode process",
		Long: `prefill runs the sim workload (simulated GPU, real engine) with the KV going over a real transport
(UCX) into a decode process (kvstream decode), which verifies every page. The link is real, so
--link-gbps and --time-scale do not apply. It prints one summary line and exits 0 only when every
chunk succeeded and the decode process found every byte equal. If the decode process dies, its
chunks fail within the finish timeout and the run stops.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config()
			if err != nil {
				return err
			}
			if cfg.TimeScale != 1 {
				return errors.Newf("--time-scale %v: prefill runs on real time (the link is real)", cfg.TimeScale)
			}
			log := cliLogger(f.verbose)
			defer log.Sync() //nolint:errcheck
			tr, err := openTransport(transport, "prefill")
			if err != nil {
				return err
			}
			defer tr.Close()
			plane, err := twoproc.NewPrefill(listen, decodeAddr, tr, log)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !f.noProg {
				cfg.Progress = func(done, total int) { fmt.Fprintf(cmd.ErrOrStderr(), "prefill: forward %d/%d done\n", done, total) }
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			mr, err := workload.RunRemote(ctx, cfg, log, plane, !monolithic)
			if err != nil {
				return err
			}
			mode := "per-layer"
			if monolithic {
				mode = "monolithic"
			}
			chunks := len(mr.PerRequest)
			line := fmt.Sprintf("prefill: %s over %s, %d requests, %d chunks failed, decode verified %d pages, bytes equal: %v, exposed transfer mean %.2f ms, %.3f GB crossed the transport at %.2f GB/s",
				mode, transport, chunks, mr.Failed, plane.Verified(), mr.Failed == 0 && plane.Verify(nil) == "" && mr.Aborted == "", mr.ExposedMs,
				float64(mr.BytesMoved)/1e9, mr.MovedGBytePerS)
			if mr.Aborted != "" {
				line += "; stopped: " + mr.Aborted
			}
			if lost := plane.Lost(); lost != nil {
				line += "; decode lost: " + lost.Error()
			}
			fmt.Fprintln(out, line)
			if mr.Failed > 0 || mr.Aborted != "" || plane.Verify(nil) != "" {
				if mr.FirstError != "" {
					fmt.Fprintln(out, "prefill: first failure:", mr.FirstError)
				}
				return errors.New("prefill: not every chunk succeeded with every byte equal")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	addWorkloadFlags(fl, f)
	fl.StringVar(&decodeAddr, "decode", "127.0.0.1:9100", "the decode process's control-plane address")
	fl.StringVar(&listen, "listen", "127.0.0.1:0", "this process's control-plane address")
	fl.StringVar(&transport, "transport", "ucx", "data transport: ucx")
	fl.BoolVar(&monolithic, "monolithic", false, "send monolithically after each forward instead of per layer")
	fl.BoolVar(&f.verbose, "verbose", false, "log the engine at DEBUG")
	fl.BoolVar(&f.noProg, "no-progress", false, "no progress lines")
	return cmd
}
