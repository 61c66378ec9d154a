package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagGroup is a titled group of a command's flags in its help.
type flagGroup struct {
	title string
	names []string
}

// Flag group titles, shared by the commands.
const (
	groupCluster   = "Cluster flags"
	groupTransport = "Transport flags"
	groupTLS       = "TLS flags"
	groupModel     = "Model and workload flags"
	groupRun       = "Run flags"
	groupOps       = "Operations flags"
)

// groupFlags makes cmd's help list its flags by group, in the order
// given; a flag in no group is listed last under "Other flags". Hidden
// flags are never listed: a command hides the shared flags it ignores.
func groupFlags(cmd *cobra.Command, groups ...flagGroup) {
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		printGroupedUsage(c.OutOrStderr(), c, groups)
		return nil
	})
}

func printGroupedUsage(w io.Writer, c *cobra.Command, groups []flagGroup) {
	fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
	all := c.Flags()
	seen := map[string]bool{}
	section := func(title string, fs *pflag.FlagSet) {
		if u := fs.FlagUsages(); strings.TrimSpace(u) != "" {
			fmt.Fprintf(w, "\n%s:\n%s", title, u)
		}
	}
	for _, g := range groups {
		fs := pflag.NewFlagSet(g.title, pflag.ContinueOnError)
		for _, n := range g.names {
			if f := all.Lookup(n); f != nil && !seen[n] {
				fs.AddFlag(f)
				seen[n] = true
			}
		}
		section(g.title, fs)
	}
	rest := pflag.NewFlagSet("other", pflag.ContinueOnError)
	all.VisitAll(func(f *pflag.Flag) {
		if !seen[f.Name] {
			rest.AddFlag(f)
		}
	})
	c.InheritedFlags().VisitAll(func(f *pflag.Flag) {
		if rest.Lookup(f.Name) == nil && !seen[f.Name] {
			rest.AddFlag(f)
		}
	})
	section("Other flags", rest)
}

// hideFlags hides flags a command takes from a shared helper but ignores:
// its help does not list them, and giving one is an error that says so.
func hideFlags(cmd *cobra.Command, why string, names ...string) {
	for _, n := range names {
		if f := cmd.Flags().Lookup(n); f != nil {
			f.Hidden = true
			f.Annotations = map[string][]string{ignoredAnnotation: {why}}
		}
	}
}

const ignoredAnnotation = "kvstream-ignored"

// refuseIgnored fails when a flag the command ignores was given.
func refuseIgnored(cmd *cobra.Command) error {
	var err error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if why, ok := f.Annotations[ignoredAnnotation]; ok && err == nil {
			err = errors.Newf("--%s: %s does not take it (%s)", f.Name, cmd.Name(), why[0])
		}
	})
	return err
}

// oneArg takes exactly one positional argument, the usage's name (FILE,
// DIR); a missing or extra one is refused naming it and what it is.
func oneArg(name, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) == 0:
			return errors.Newf("%s: missing %s: %s (usage: %s)", cmd.Name(), name, what, cmd.UseLine())
		case len(args) > 1:
			return errors.Newf("%s: one %s (%s), got %d arguments: %q", cmd.Name(), name, what, len(args), args)
		}
		return nil
	}
}
