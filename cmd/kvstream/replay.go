package main

import (
	"fmt"
	"os"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/replay"
	"github.com/kvstream/kvstream/trace"
	"github.com/spf13/cobra"
)

func newReplay() *cobra.Command {
	var engine bool
	cmd := &cobra.Command{
		Use:   "replay FILE",
		Short: "Replay a recorded message trace and report where it diverges",
		Long: `replay feeds a message trace (recorded with KVSTREAM_TRACE=path, system.WithTrace or
kvstream sim --record) to fresh functional cores, with no goroutine, clock or hardware, and checks
that every message an actor sent and every effect a core returned matches the recording. It prints
a summary (rooms, chunks, forwards, statuses) and either "replayed N messages, no divergence" or
the first divergence with both sides; it exits 1 on a divergence.

With --engine it also replays the trace's calls through a real engine on the simulated GPU and the
loopback transport and compares the chunk statuses and the destination bytes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			tr, err := trace.Read(f)
			if err != nil {
				return errors.Wrap(err, args[0])
			}
			out, err := replay.Cores(tr)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s (kvstream %s, %d hook layers, group %d, %d buffers)\n", args[0], tr.Header.EngineVersion,
				tr.Header.Config.HookLayers, tr.Header.Config.GroupSize, len(tr.Header.Config.Buffers))
			fmt.Fprintln(w, out)
			if out.Divergence != nil {
				return errors.New("the replay diverged from the recording")
			}
			if engine {
				eo, err := replay.Engine(cmd.Context(), tr)
				if err != nil {
					return errors.Wrap(err, "engine replay")
				}
				fmt.Fprintf(w, "engine replay: %d chunks, statuses %v\n", eo.Chunks, eo.Replayed)
				if eo.Mismatch != "" {
					return errors.Newf("engine replay: %s (recorded %v, replayed %v)", eo.Mismatch, eo.Recorded, eo.Replayed)
				}
				fmt.Fprintln(w, "engine replay: same statuses, bytes equal")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&engine, "engine", false, "also replay through a real engine on simulated hardware")
	return cmd
}
