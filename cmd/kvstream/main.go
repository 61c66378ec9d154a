package main

import (
	"fmt"
	"io"
	"os"

	"github.com/kvstream/kvstream/lab/buildinfo"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/system"
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
	addLogFlags(root.PersistentFlags())
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkLogFlags(cmd); err != nil {
			return err
		}
		if envFree[cmd.Name()] {
			return nil
		}
		// The engine's environment variables, checked as the engine does
		// before any work: a flag that sets the same knob does not hide a
		// malformed variable.
		return system.CheckEnv()
	}
	info := buildinfo.Read()
	root.Version = info.Version
	root.SetVersionTemplate(info.String())
	root.AddCommand(newVersion(info), newSim(), newGenerate(), newReplay(), newPrefill(), newDecode(s), newBench(), newCerts(), newUp(), newDecodeInstance(), newPrefillRank(), newSoak())
	return root
}

// envFree are the commands that run no engine and so do not check its
// environment variables.
var envFree = map[string]bool{"version": true, "certs": true, "help": true, "completion": true}

// newVersion is `kvstream version`: what `--version` prints.
func newVersion(info buildinfo.Info) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the module version, commit, Go release, UCX versions (built with, running with) and control protocol version",
		Long: `version prints what this binary is: the module version ("(devel)" for a build from a work tree), the
VCS commit it was built from ("unknown" when the build did not record it; "+dirty" when the work tree
had changes), the Go release, the UCX version it was built against and the one it runs with ("none"
without the ucx build tag), and the decode control protocol version (a decode refuses a prefill of
another version: deploy both sides of one version). Every command that serves /metrics exports the
same as kvstream_build_info.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), info.String())
			return err
		},
	}
}
