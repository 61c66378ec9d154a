package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/lab/replay"
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

A decode server's trace (KVSTREAM_TRACE=path writes path.decode, decode.Config.TracePath, kvstream
decode --record) is replayed through a fresh decode core the same way: every effect, every Call
answered by the next record, one outcome per revocation, each timer fired at most once.

With --engine it also replays the trace's calls through a real engine on the simulated GPU and the
loopback transport and compares the chunk statuses and the destination bytes.`,
		Args: oneArg("FILE", "the trace file to replay"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			// The trace is streamed: one line at a time, each within the
			// bound of the header's geometry (docs/TRACES.md).
			open := func() (trace.Stream, error) {
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return nil, err
				}
				rd, err := trace.NewReader(f)
				return rd, errors.Wrap(err, args[0])
			}
			s, err := open()
			if err != nil {
				return err
			}
			h := s.Header()
			out, err := replay.Cores(s)
			if err != nil {
				return errors.Wrap(err, args[0])
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s (%s)\n", args[0], replay.Describe(h))
			fmt.Fprintln(w, out)
			if out.Divergence != nil {
				return errors.New("the replay diverged from the recording")
			}
			if engine {
				eo, err := replay.Engine(cmd.Context(), open)
				if err != nil {
					return errors.Wrap(err, "engine replay")
				}
				fmt.Fprintf(w, "engine replay: %d chunks, statuses %s\n", eo.Chunks, excerpt(eo.Replayed))
				if eo.Mismatch != "" {
					return errors.Newf("engine replay: %s (recorded %s, replayed %s)", eo.Mismatch, excerpt(eo.Recorded), excerpt(eo.Replayed))
				}
				fmt.Fprintln(w, "engine replay: same statuses, bytes equal")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&engine, "engine", false, "also replay through a real engine on simulated hardware")
	return cmd
}

// excerpt prints per-room statuses within replay.MaxExcerpt bytes: a trace
// may hold thousands of rooms.
func excerpt(rooms []string) string {
	return trace.Excerpt("["+strings.Join(rooms, "; ")+"]", replay.MaxExcerpt)
}
