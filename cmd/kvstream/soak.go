package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/soak"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// newSoak is `kvstream soak`: its flags fill a soak.Config, whose
// processes are this binary's own decode and prefill commands.
func newSoak() *cobra.Command {
	cfg := soak.Config{Seed: 1, Bounds: soak.DefaultBounds, Workload: soak.DefaultWorkload}
	var mix, decodeLog string
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Run a decode service against legitimate prefills and faults for a while, and report what it kept",
		Long: `soak runs kvstream decode as a service (a child process, --heartbeat as given) for --for (or
--episodes main-lane episodes), against two lanes at once, and reports.

The main lane runs kvstream prefill processes one after another (each writes the same rooms, so
one at a time; the next starts once the decode ended every session of the last): clean (run to its
end: exit 0 with every byte equal), kill (SIGKILL at a random instant of its run, Hello included),
stop (SIGSTOP once its session opened, until the decode declared it lost; then SIGCONT, after which
it must fail on its own, or SIGKILL) and pause-decode (the decode stopped for twice --heartbeat while
a prefill streams: the prefill declares it lost and exits, the decode goes on). The side lane runs
sessions that report no room, from this process: vanish (a helper process says Hello and is
killed), refused (a Hello the decode must refuse: a sharded prefill) and bye-writer (writes into
the decode's pool over UCX, says Bye, and goes on writing for 3 s: not one of those writes may
complete). Each lane first runs every kind of --mix of positive weight once, then picks by weight.

The decode's resident memory and open files (/proc) and goroutines (its /metrics) are sampled every
250 ms. The start figures are taken after a clean warm-up (the first session allocates a pool and
lazy structures), the end figures after the last episode; both once the decode ended every session
and --settle passed (a revoked UCX worker lingers 2 s). The soak fails (exit 1) on a decode crash
(an exit before the soak's SIGTERM, a UCX Fatal, a Go panic, SIGSEGV, SIGABRT), a legitimate
session that failed or did not find every byte equal, a bye-writer write that completed after its
Bye returned, a fault not answered as it must be, growth past a --max-* bound, or a decode that
does not drain cleanly at the end.

UCX_TLS passes to every process (tcp, or sm,self for shared memory), and UCX_LOG_FILE (stderr unless
set: the soak runs UCX in its own process too, and the report owns stdout). The binary must be built
with -tags ucx.`,
		Example: `  UCX_TLS=tcp kvstream soak --for 5m --json
  UCX_TLS=sm,self kvstream soak --for 2m
  UCX_TLS=tcp kvstream soak --episodes 8 --mix clean=1,kill=1,stop=1,pause-decode=1,vanish=1,refused=1,bye-writer=1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.Mix, err = soak.ParseMix(mix); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return errors.Wrap(err, "soak: this binary's path")
			}
			cfg.Command = func(args ...string) *exec.Cmd { return exec.Command(exe, args...) }
			cfg.Open = func(kind, name string) (rdma.Transport, error) { return openTransport(kind, name, transportOpts{}) }
			if err := cfg.Check(); err != nil {
				return err
			}
			if os.Getenv("UCX_LOG_FILE") == "" {
				// UCX logs to stdout unless told otherwise (it reads where
				// when it loads), which would mix its lines (the
				// bye-writer's reconnections to revoked access points fail
				// loudly) into the report: run again with them on stderr.
				return syscall.Exec(exe, os.Args, append(os.Environ(), "UCX_LOG_FILE=stderr"))
			}
			if decodeLog != "" {
				f, err := os.Create(decodeLog)
				if err != nil {
					return errors.Wrap(err, "--decode-log")
				}
				defer f.Close()
				cfg.DecodeOutput = f
			}
			cfg.Log = cmd.ErrOrStderr()
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			rep, err := soak.Run(ctx, cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if jsonOut {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				fmt.Fprint(out, rep.Text())
			}
			if !rep.OK {
				return errors.Newf("soak failed: %s", strings.Join(rep.Failures, "; "))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&cfg.For, "for", 2*time.Minute, "how long the main lane runs episodes (after the warm-up)")
	fl.IntVar(&cfg.Episodes, "episodes", 0, "stop after this many main-lane episodes, if sooner than --for (0: no limit)")
	fl.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the kinds, the fault instants and the prefills' bytes")
	fl.StringVar(&mix, "mix", soak.DefaultMix, "kind=weight,...: main lane "+kinds(soak.MainKinds)+"; side lane "+kinds(soak.SideKinds)+"; a kind not named does not run")
	fl.BoolVar(&jsonOut, "json", false, "print the report as JSON")
	fl.StringVar(&decodeLog, "decode-log", "", "write everything the decode process prints (its DEBUG log, UCX's, a crash's backtrace) to FILE")
	fl.Float64Var(&cfg.Bounds.RSSGrowthMiB, "max-rss-growth-mib", cfg.Bounds.RSSGrowthMiB, "fail if the decode's resident memory grew by more, start to end, MiB")
	fl.IntVar(&cfg.Bounds.FDGrowth, "max-fd-growth", cfg.Bounds.FDGrowth, "fail if the decode's open files grew by more, start to end")
	fl.IntVar(&cfg.Bounds.GoroutineGrowth, "max-goroutine-growth", cfg.Bounds.GoroutineGrowth, "fail if the decode's goroutines grew by more, start to end")
	fl.DurationVar(&cfg.Heartbeat, "heartbeat", 2*time.Second, "--heartbeat of the decode and the prefills: a silent peer is lost within it; a pause-decode lasts twice as long")
	fl.DurationVar(&cfg.Settle, "settle", 4*time.Second, "before the start and end figures, wait this long after the decode ended its last session")
	addSoakWorkloadFlags(fl, &cfg.Workload)
	cmd.AddCommand(newSoakVanish())
	groupFlags(cmd, []flagGroup{
		{groupRun, []string{"for", "episodes", "seed", "mix", "heartbeat", "settle", "json", "decode-log"}},
		{"Bound flags", []string{"max-rss-growth-mib", "max-fd-growth", "max-goroutine-growth"}},
		{groupModel, []string{"requests", "prompt-tokens", "chunk-tokens", "page-size", "scale", "layer-us-per-ktok"}}}...)
	return cmd
}

// addSoakWorkloadFlags declares what every main-lane prefill runs (and
// what the vanish helper says Hello with).
func addSoakWorkloadFlags(fl *pflag.FlagSet, w *soak.Workload) {
	fl.IntVar(&w.Requests, "requests", w.Requests, "every prefill's requests (each its room, all resident)")
	fl.IntVar(&w.PromptTokens, "prompt-tokens", w.PromptTokens, "prompt length of every request")
	fl.IntVar(&w.ChunkTokens, "chunk-tokens", w.ChunkTokens, "token budget of one forward")
	fl.IntVar(&w.PageSize, "page-size", w.PageSize, "tokens per page")
	fl.IntVar(&w.Scale, "scale", w.Scale, "divide bytes per page by this (the decode's pool stays small)")
	fl.Float64Var(&w.LayerUsPerKTok, "layer-us-per-ktok", w.LayerUsPerKTok, "modeled compute per layer per 1000 tokens, µs: how long a prefill runs")
}

func kinds(ks []soak.Kind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// newSoakVanish is the soak's vanishing prefill, a process of its own
// (hidden: the soak starts it).
func newSoakVanish() *cobra.Command {
	cfg := soak.VanishConfig{Workload: soak.DefaultWorkload, Seed: 1}
	cmd := &cobra.Command{
		Use:    "vanish",
		Short:  "Open a session with a decode and wait, without Bye, to be killed (kvstream soak's helper)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkHostPort("--decode", cfg.Decode, false); err != nil {
				return err
			}
			if cfg.Name == "" {
				return errors.New("--name is empty: the session's name")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			return soak.RunVanish(ctx, cfg, cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Decode, "decode", "", "the decode's control-plane address")
	fl.StringVar(&cfg.Name, "name", "", "the session's name")
	fl.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "the prefills' seed")
	fl.DurationVar(&cfg.Heartbeat, "heartbeat", 2*time.Second, "declare the decode lost when it answered no heartbeat for this long")
	addSoakWorkloadFlags(fl, &cfg.Workload)
	return cmd
}
