// Command kvstream runs and measures the kvstream engine: `sim` streams a
// realistic prefill→decode workload on the embedded defaults and compares it
// with the monolithic post-forward send.
//
// Each command is its flags and a call of the product or the lab (lab/...);
// the programs themselves live there.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/spf13/cobra"
)

func main() { os.Exit(execute(newRoot(), os.Stderr)) }

// execute runs the command line and returns the process's exit status,
// saying on stderr why it failed.
func execute(root *cobra.Command, stderr io.Writer) int {
	if err := root.Execute(); err != nil {
		fmt.Fprintln(stderr, "kvstream:", err)
		return 1
	}
	return 0
}

// seams are the test hooks of the lab's programs, which only a test sets:
// the test binary, run as the command in a child process it started (its
// TestMain), passes them to newRootWith. The production binary builds its
// commands with none (newRoot), and reads no hook from anywhere.
type seams struct {
	// decode adjusts kvstream decode's program before it runs
	// (DecodeProcessConfig.DisconnectAfter).
	decode func(*simsession.DecodeProcessConfig)
}

func newRoot() *cobra.Command { return newRootWith(seams{}) }

func newRootWith(s seams) *cobra.Command {
	root := &cobra.Command{
		Use:           "kvstream",
		Short:         "Per-layer KV-cache streaming from prefill to decode",
		Long:          "kvstream streams an LLM's KV cache from a prefill GPU to decode GPUs layer group by layer group,\noverlapped with the forward pass.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newSim(), newGenerate(), newReplay(), newPrefill(), newDecode(s), newBench(), newCerts(), newUp(), newDecodeInstance(), newPrefillRank(), newSoak())
	return root
}
