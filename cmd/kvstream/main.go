// Command kvstream runs and measures the kvstream engine: `sim` streams a
// realistic prefill→decode workload on the embedded defaults and compares it
// with the monolithic post-forward send.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvstream:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "kvstream",
		Short:         "Per-layer KV-cache streaming from prefill to decode",
		Long:          "kvstream streams an LLM's KV cache from a prefill GPU to decode GPUs layer group by layer group,\noverlapped with the forward pass.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newSim(), newGenerate(), newReplay(), newPrefill(), newDecode(), newBench(), newCerts(), newUp(), newDecodeInstance(), newPrefillRank(), newSoak())
	return root
}
