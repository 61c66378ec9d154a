package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/fileread"
	"github.com/kvstream/kvstream/lab/scalebench"
	"github.com/spf13/cobra"
)

// newBenchScale is `kvstream bench scale`: the engine's cost curve
// (lab/scalebench).
func newBenchScale() *cobra.Command {
	var (
		quick, jsonOut, noSim, quiet bool
		budget                       time.Duration
		from, plot, axis             string
		simRuns                      int
	)
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Measure how the engine's cost grows with rooms, destinations, layers and fragmentation",
		Long: `scale sweeps the engine's work along four axes, one at a time around a base point: rooms in
flight (one-page chunks bound to one forward), destinations per chunk, hook layers (one MLA buffer
each, K = 8) and fragmentation (the decode pages of a 100k-token chunk, one token per page, in runs
of that many consecutive pages). Per point it reports:

  layer_end_ns             the forward thread in a LayerEnd that closes no group
  boundary_ns              the forward thread in a boundary LayerEnd (event record, and the fan-out:
                           one queue entry per chunk host)
  boundary_ns_per_context  boundary_ns divided by the rooms bound to the forward
  boundary_cpu_ns_per_context
                           the whole fan-out's CPU time (every thread: the forward thread, the
                           chunk hosts stepping each chunk's core) per room bound
  boundary_allocs          heap allocations per boundary (every goroutine's, until the chunks took it)
  allocs_per_forward       heap allocations from BeginForward to the forward's last batch completed
  bytes_per_room           live heap per room registered and bound (page lists excluded)
  plan_ms                  plan.BuildPlan of the 100k-page chunk
  writes_per_group         writes posted per group of the 100k-page chunk (every destination's)
  ns_per_write             the process's CPU time per write posted, from BeginForward to the last
                           batch of the 100k-page chunk completed
  exposed_over_floor       kvstream sim's per-layer exposure of the forward over its floor (the last
                           room's exposed time over the ideal sender's last landing, a bound
                           whatever the order the rooms are served in), the median of --sim-runs
                           runs: one forward of 16384 tokens split over the point's rooms (one
                           request each, page size 16, --scale 64, no byte check at each Finish:
                           the transport oracle and the checks at release stay), decode TP =
                           destinations, the point's layers; null for fragmentation, which the
                           sim does not model
  sim_link_lag_ms          how late the sim's emulated link landed that run's batches after their
                           modeled instants (p99): the emulator waiting for a processor; where it
                           is a large part of the floor, exposed_over_floor is not the engine's alone

The engine's figures come from a real engine whose stream's events are complete at once and whose
transport completes every batch at once without moving a byte: they are the engine's own work.
Allocations are counted process-wide, so they include what the actors did because of the call.
--quick is a reduced sweep (under a minute) for CI; the full sweep takes a few minutes.
docs/PERFORMANCE.md ("The cost curve") gives the figures, the targets and the plot.`,
		Example: `  kvstream bench scale --quick
  kvstream bench scale --json > /tmp/scale.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := runScale(cmd, from, axis, quick, noSim, quiet, budget, simRuns)
			if err != nil {
				return err
			}
			if plot != "" {
				if err := writeScalePlot(plot, rep); err != nil {
					return err
				}
			}
			if jsonOut {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			return printScale(cmd.OutOrStdout(), rep)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&quick, "quick", false, "a reduced sweep that takes under a minute")
	fl.BoolVar(&jsonOut, "json", false, `print {"base": ..., "rows": [...], "slopes": [...]} as one JSON object`)
	fl.BoolVar(&noSim, "no-sim", false, "skip the sim (exposed_over_floor null everywhere)")
	fl.StringVar(&axis, "axis", "", "sweep only this axis: rooms, destinations, layers or fragmentation")
	fl.IntVar(&simRuns, "sim-runs", 0, "sim runs per point, the median reported (default 3, 1 with --quick)")
	fl.BoolVar(&quiet, "quiet", false, "no progress lines on stderr")
	fl.DurationVar(&budget, "budget", 0, "about how long each timed loop runs (default 200ms, 20ms with --quick)")
	fl.StringVar(&from, "from", "", "read a report this command printed with --json instead of measuring (to print or plot it again)")
	fl.StringVar(&plot, "plot", "", "also draw the curves into this SVG file (four log-log panels, one per axis)")
	return cmd
}

// Bounds of bench scale's inputs: a report (--from) is read through a
// limit (the committed docs/scale.json is 14 KiB; /dev/zero once grew the
// process past 3.7 GB), and --budget, the time of each timed loop
// (default 200 ms), is bounded far above what a measurement needs.
const (
	maxScaleReport = 4 << 20
	maxScaleBudget = 10 * time.Second
)

// readScaleReport reads a report of bench scale --json (--from), at most
// maxScaleReport bytes, and checks its rows: a known axis and a value of
// at least 1 (the curves are log-log); errors name the file, the row and
// the field.
func readScaleReport(from string) (*scalebench.Report, error) {
	raw, err := fileread.Read(from, maxScaleReport)
	switch {
	case errors.Is(err, fileread.ErrTooLong):
		return nil, errors.Newf("--from %s: longer than the bound of %d MiB for a report of kvstream bench scale --json", from, maxScaleReport>>20)
	case err != nil:
		return nil, errors.Wrapf(err, "--from %s", from)
	}
	var rep scalebench.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return nil, errors.Wrapf(err, "--from %s: not a report of kvstream bench scale --json", from)
	}
	if len(rep.Rows) == 0 {
		return nil, errors.Newf("--from %s: no rows", from)
	}
	for i, r := range rep.Rows {
		if !slices.Contains(scalebench.Axes, r.Axis) {
			return nil, errors.Newf("--from %s: row %d: axis %.64q: want %s", from, i+1, r.Axis, strings.Join(scalebench.Axes, ", "))
		}
		if r.Value < 1 {
			return nil, errors.Newf("--from %s: row %d (%s): value %d: must be at least 1", from, i+1, r.Axis, r.Value)
		}
	}
	rep.Slopes = scalebench.Slopes(&rep)
	return &rep, nil
}

// runScale measures a sweep, or reads one (--from).
func runScale(cmd *cobra.Command, from, axis string, quick, noSim, quiet bool, budget time.Duration, simRuns int) (*scalebench.Report, error) {
	if from != "" {
		return readScaleReport(from)
	}
	cfg := scalebench.Full()
	if quick {
		cfg = scalebench.Quick()
	}
	if axis != "" {
		if err := cfg.Only(axis); err != nil {
			return nil, errors.Wrap(err, "--axis")
		}
	}
	if cmd.Flags().Changed("budget") {
		if budget <= 0 || budget > maxScaleBudget {
			return nil, errors.Newf("--budget %v: must be positive and at most %v (each timed loop; a sweep runs dozens)", budget, maxScaleBudget)
		}
		cfg.Budget = budget
	}
	cfg.Sim = !noSim
	if cmd.Flags().Changed("sim-runs") {
		cfg.SimRuns = simRuns
	}
	if !quiet {
		cfg.Progress = cmd.ErrOrStderr()
	}
	return scalebench.Run(cmd.Context(), cfg)
}

func writeScalePlot(path string, rep *scalebench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return errors.Wrapf(err, "--plot %s", path)
	}
	if err := scalebench.WriteSVG(f, rep); err != nil {
		_ = f.Close()
		return errors.Wrapf(err, "--plot %s", path)
	}
	return errors.Wrapf(f.Close(), "--plot %s", path)
}

func printScale(w io.Writer, rep *scalebench.Report) error {
	b := rep.Base
	if _, err := fmt.Fprintf(w, "base: rooms %d, destinations %d, layers %d, fragmentation %d (K = %d, 100k-page chunk)\n",
		b.Rooms, b.Dests, b.Layers, b.Frag, scalebench.GroupSize); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(tw, "axis\tvalue\tLayerEnd ns\tboundary ns\tns/context\tCPU ns/context\tallocs/boundary\tallocs/forward\tB/room\tend µs/room\tend CPU µs/room\tplan ms\twrites/group\tns/write\texposed÷floor\tlink lag ms\t")
	for _, r := range rep.Rows {
		exp, lag := "-", "-"
		if r.ExposedOverFloor != nil {
			exp = fmt.Sprintf("%.3f", *r.ExposedOverFloor)
		}
		if r.SimLinkLagMs != nil {
			lag = fmt.Sprintf("%.3f", *r.SimLinkLagMs)
		}
		_, _ = fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.1f\t%.1f\t%.2f\t%.0f\t%.1f\t%s\t%s\t\n", r.Axis, r.Value,
			r.LayerEndNs, r.BoundaryNs, r.BoundaryNsPerContext, r.BoundaryCPUNsPerContext, r.BoundaryAllocs, r.AllocsPerForward, r.BytesPerRoom,
			r.EndWallNsPerRoom/1e3, r.EndCPUNsPerRoom/1e3, r.PlanMs, r.WritesPerGroup, r.NsPerWrite, exp, lag)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Slopes) > 0 {
		_, _ = fmt.Fprintln(w, "\nfitted exponent b of metric ∝ value^b along each axis (0: flat, 1: proportional):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		_, _ = fmt.Fprintln(tw, "metric\trooms\tdestinations\tlayers\tfragmentation\t")
		for _, m := range scalebench.Metrics {
			_, _ = fmt.Fprintf(tw, "%s", m.Name)
			for _, axis := range scalebench.Axes {
				cell := "-"
				for _, sl := range rep.Slopes {
					if sl.Axis == axis && sl.Metric == m.Name {
						cell = fmt.Sprintf("%+.2f", sl.Exponent)
					}
				}
				_, _ = fmt.Fprintf(tw, "\t%s", cell)
			}
			_, _ = fmt.Fprintln(tw, "\t")
		}
		return tw.Flush()
	}
	return nil
}
