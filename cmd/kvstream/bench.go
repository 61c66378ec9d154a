package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/hostprobe"
	"github.com/kvstream/kvstream/lab/xferbench"
	"github.com/spf13/cobra"
)

// newBench is `kvstream bench`, the parent of the data-path benchmarks.
func newBench() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure kvstream's data path",
		Long:  "bench measures parts of kvstream's data path in isolation (`kvstream bench transport`), and the\nmachine under it (`kvstream bench host`).",
		Args:  cobra.ArbitraryArgs,
		// Without a subcommand it prints its help; with one it does not
		// have, it fails naming it and the choices (cobra alone would
		// print the help and exit 0).
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			var names []string
			for _, c := range cmd.Commands() {
				if c.IsAvailableCommand() {
					names = append(names, c.Name())
				}
			}
			want := names[len(names)-1]
			if len(names) > 1 {
				want = strings.Join(names[:len(names)-1], ", ") + " or " + want
			}
			return errors.Newf("bench %q: no such benchmark: want %s", args[0], want)
		},
	}
	cmd.AddCommand(newBenchTransport(), newBenchHost(), newBenchScale())
	return cmd
}

// newBenchTransport is `kvstream bench transport`: its flags fill an
// xferbench.Config, which opens non-loopback transports through this
// binary's registry.
func newBenchTransport() *cobra.Command {
	var writes string
	cfg := xferbench.Config{Size: 1 << 20, Open: func(kind, name string) (rdma.Transport, error) {
		return openTransport(kind, name, transportOpts{writes: writes})
	}}
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "transport",
		Short: "Measure put bandwidth through the engine's transport (loopback or ucx)",
		Long: `transport measures what the engine's submitters get from a transport: it opens a sender and
its own target side in this process (loopback: two nodes of a fresh fabric; ucx: two UCX
transports), gives each a region (--pool), connects, imports the destination, and posts --count
writes of --size bytes through rdma.Endpoint.Post, --writes-per-batch writes per batch with up to
--window batches in flight. A batch counts when its completion reports the bytes visible at the
destination (UCX: after its flush). The clock runs from the first post to the last completion. A
warm-up of the same shape (--count writes, at least one window) runs first, untimed, again and
again until --warmup-for has passed: on this project's VMs UCX's first run after connecting was
measured at half the speed of the next, and the machine itself takes a few hundred milliseconds of
steady copying to reach the speed it keeps.

--pool says where the regions come from: allocated by the transports (rdma.Allocator: UCX's
ucp_mem_map allocation, which a peer on the same host maps so that a put is one memcpy; hostmem on
the loopback), registered (hostmem blocks registered with Register, as a GPU pool or memory the
serving stack owns is), or auto (allocated when the transport allocates).

Write i reads source slot i mod --slots and writes the same destination slot. The default, one
slot, is ucx_perftest's layout (every put covers the same buffer); more slots spread the writes
over more memory, as KV pages are. After every run the destination slots are compared with the
source (they are cleared before the run), so a run that measured nothing fails.

--memcpy also times a plain memcpy of the same bytes (same sizes, same count, same slots, hostmem
to hostmem), alternating with the transport runs, and reports the ratio (the project target is
loopback ≥ 0.8× memcpy). --perftest (ucx only) also runs UCX's own benchmark after every run:
ucx_perftest -t ucp_put_bw, a server and a client process on 127.0.0.1, with the same size and
count and the same environment (UCX_TLS ...), once with its default buffers (UCX allocates them)
and once with UCX_ALLOC_PRIO=mmap,heap (buffers UCX cannot export), and reports the ratios (the
project target is ucx ≥ 0.9× ucx_perftest with default buffers). --repeat runs all of them that
many times, alternating, and reports medians and ranges; a ratio is the median of the rounds'
ratios. UCX reads UCX_TLS and its other UCX_* variables from the environment.`,
		Example: `  kvstream bench transport --transport loopback --size 1M --count 2000 --memcpy --repeat 5
  UCX_TLS=tcp kvstream bench transport --transport ucx --size 64K --count 20000 --json
  UCX_TLS=posix,self kvstream bench transport --transport ucx --size 1M --count 4096 --perftest --repeat 5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case !cmd.Flags().Changed("warmup"):
				cfg.Warmup = -1 // one untimed run
			case cfg.Warmup < 0:
				return errors.Newf("--warmup %d: must not be negative", cfg.Warmup)
			}
			if err := checkWrites(writes); err != nil {
				return err
			}
			rep, err := xferbench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if jsonOut {
				enc := json.NewEncoder(cmd.OutOrStdout())
				return enc.Encode(rep)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), rep.Line())
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Transport, "transport", "loopback", "transport to measure: loopback, or ucx in a binary built with -tags ucx")
	fl.Var((*xferbench.Size)(&cfg.Size), "size", "bytes per write; suffixes K, M, G (also KiB/KB, …: all powers of 1024), e.g. 64K, 1M, 4MiB")
	fl.IntVar(&cfg.Count, "count", 1000, "writes to time")
	fl.IntVar(&cfg.Window, "window", 64, "batches in flight at most")
	fl.IntVar(&cfg.WritesPerBatch, "writes-per-batch", 1, "writes per posted batch (the engine posts a group's blocks as one batch)")
	fl.IntVar(&cfg.Slots, "slots", 1, "source and destination slots of --size bytes; write i uses slot i mod slots")
	fl.IntVar(&cfg.Warmup, "warmup", 0, "untimed writes first (default: --count, at least window × writes-per-batch)")
	fl.DurationVar(&cfg.WarmupFor, "warmup-for", 500*time.Millisecond, "repeat the untimed warm-up run until this much time has passed (0: one run)")
	fl.IntVar(&cfg.Repeat, "repeat", 1, "timed runs (alternating with memcpy runs under --memcpy); medians are reported")
	fl.BoolVar(&cfg.Memcpy, "memcpy", false, "also time a plain memcpy of the same bytes and report the ratio")
	fl.StringVar(&cfg.Pool, "pool", xferbench.PoolAuto, "regions: allocated (by the transport), registered (hostmem), or auto (allocated when the transport allocates)")
	fl.BoolVar(&cfg.Perftest, "perftest", false, "ucx: also run ucx_perftest ucp_put_bw (default and mmap,heap buffers) with the same size and count, and report the ratios")
	fl.StringVar(&cfg.PerftestPath, "perftest-path", "ucx_perftest", "the ucx_perftest binary --perftest runs")
	addWritesFlag(fl, &writes)
	fl.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "give up (and fail) when the whole benchmark takes longer")
	fl.BoolVar(&jsonOut, "json", false, "print the report as one JSON object")
	return cmd
}

// hostReport is `kvstream bench host`'s report.
type hostReport struct {
	Stalls hostprobe.Stalls `json:"stalls"`
	Wake   hostprobe.Wake   `json:"wake"`
}

// Bounds of bench host's durations: far above what a measurement needs
// (the defaults are 2 s and 300 µs), low enough that a typo ("100000h")
// does not hold a CPU or the terminal for days.
const (
	maxHostDuration = 10 * time.Minute
	maxHostIdle     = time.Second
)

// newBenchHost is `kvstream bench host`: the machine's stalls and wake-up
// cost, which bound how near the sim's exposed times can come to their
// floors (docs/PERFORMANCE.md).
func newBenchHost() *cobra.Command {
	var (
		duration, threshold, idle time.Duration
		wakes                     int
		jsonOut                   bool
	)
	cmd := &cobra.Command{
		Use:   "host",
		Short: "Measure the machine's stalls and the cost of waking an idle CPU",
		Long: `host measures two things no code in this process can change, and which decide how close the sim's
exposed times can come to their floors (0.2 ms at the default preset, a few goroutine hand-offs
between a forward's end and Finish's return):

stalls: one thread spins for --duration reading the clock; every gap between two reads longer than
--threshold is time the CPU was taken from it (on a virtual machine, its exits and the host's own
work, which the guest does not see as interrupts and may not report as steal time). Reported: gaps
per second, their mean and longest, and the share of the thread's time they took.

wake: --wakes times, sleep --idle (so that the other CPUs go idle, as between a forward's layers),
then hand a value to a goroutine parked on a channel. Reported: how long the send took (waking an
idle CPU is paid by the sender) and how long until the receiver ran, as percentiles.

docs/PERFORMANCE.md ("The machine") gives what it measured on the machine its figures were taken on.`,
		Example: `  kvstream bench host
  kvstream bench host --duration 5s --wakes 5000 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case duration <= 0 || duration > maxHostDuration:
				return errors.Newf("--duration %v: must be positive and at most %v (the probe spins a CPU all along)", duration, maxHostDuration)
			case threshold <= 0:
				return errors.Newf("--threshold %v: must be positive", threshold)
			case wakes <= 0 || wakes > hostprobe.MaxWakes:
				return errors.Newf("--wakes %d: must be 1 to %d", wakes, hostprobe.MaxWakes)
			case idle <= 0 || idle > maxHostIdle:
				return errors.Newf("--idle %v: must be positive and at most %v", idle, maxHostIdle)
			case time.Duration(wakes)*idle > maxHostDuration: // both bounded: no overflow
				return errors.Newf("--wakes %d x --idle %v: the wake probe would sleep %v, above the bound of %v", wakes, idle, time.Duration(wakes)*idle, maxHostDuration)
			}
			var rep hostReport
			var err error
			if rep.Stalls, err = hostprobe.MeasureStalls(duration, threshold); err != nil {
				return err
			}
			if rep.Wake, err = hostprobe.MeasureWake(wakes, idle); err != nil {
				return err
			}
			if jsonOut {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			s, w := rep.Stalls, rep.Wake
			_, err = fmt.Fprintf(cmd.OutOrStdout(),
				"stalls: %.0f/s, mean %.1f µs, longest %.1f µs: %.2f%% of a busy thread's time (gaps > %.0f µs over %.0f ms; a clock read takes %.0f ns)\n"+
					"wake:   send p50 %.1f p90 %.1f p99 %.1f µs; receiver running after p50 %.1f p90 %.1f p99 %.1f µs (%d hand-offs, each after %.0f µs idle)\n",
				s.PerSecond, s.MeanUs, s.MaxUs, 100*s.Fraction, s.ThresholdUs, s.DurationMs, s.ReadNs,
				w.SendUs.P50, w.SendUs.P90, w.SendUs.P99, w.LatencyUs.P50, w.LatencyUs.P90, w.LatencyUs.P99, w.N, w.IdleUs)
			return err
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&duration, "duration", 2*time.Second, "how long the stall probe spins")
	fl.DurationVar(&threshold, "threshold", 5*time.Microsecond, "a gap between two clock reads longer than this is a stall")
	fl.IntVar(&wakes, "wakes", 2000, "hand-offs the wake probe times")
	fl.DurationVar(&idle, "idle", 300*time.Microsecond, "how long the wake probe's sender sleeps before each hand-off")
	fl.BoolVar(&jsonOut, "json", false, "print the report as one JSON object")
	return cmd
}
