package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/kvstream/kvstream/decode"
	"github.com/prometheus/client_golang/prometheus"
)

// Unknown stands for what the binary does not record (a build without VCS
// stamping, a test binary).
const Unknown = "unknown"

// NoUCX is the UCX version of a binary built without the ucx build tag.
const NoUCX = "none (built without ucx)"

// Info is what a binary is.
type Info struct {
	// Version is the main module's version: a release tag for `go install
	// module@version`, "(devel)" for a build from a work tree.
	Version string
	// Commit is the VCS revision the binary was built from, with "+dirty"
	// when the work tree had changes; Unknown when not recorded.
	Commit string
	// GoVersion is the Go release that built it.
	GoVersion string
	// Protocol is the decode control protocol version it speaks
	// (decode.ProtocolVersion); a peer of another version is refused.
	Protocol uint32
	// UCXBuilt is the UCX API version it was compiled against, and
	// UCXRuntime the libucp it runs with; NoUCX for both without the ucx
	// build tag.
	UCXBuilt, UCXRuntime string
}

// Read returns this binary's Info.
func Read() Info {
	built, run := ucxVersions()
	bi, ok := debug.ReadBuildInfo()
	return fromBuildInfo(bi, ok, built, run)
}

// fromBuildInfo fills an Info from what the Go toolchain recorded (ok
// false: nothing recorded).
func fromBuildInfo(bi *debug.BuildInfo, ok bool, built, run string) Info {
	in := Info{Version: Unknown, Commit: Unknown, GoVersion: runtime.Version(), Protocol: decode.ProtocolVersion,
		UCXBuilt: built, UCXRuntime: run}
	if !ok || bi == nil {
		return in
	}
	if bi.Main.Version != "" {
		in.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		in.Commit = rev
		if dirty {
			in.Commit += "+dirty"
		}
	}
	return in
}

// String is the text `kvstream version` prints, one field a line.
func (in Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kvstream %s\n", in.Version)
	fmt.Fprintf(&b, "commit:   %s\n", in.Commit)
	fmt.Fprintf(&b, "go:       %s\n", in.GoVersion)
	fmt.Fprintf(&b, "protocol: %d\n", in.Protocol)
	if in.UCXBuilt == NoUCX {
		fmt.Fprintf(&b, "ucx:      %s\n", NoUCX)
	} else {
		fmt.Fprintf(&b, "ucx:      built with %s, running with %s\n", in.UCXBuilt, in.UCXRuntime)
	}
	return b.String()
}

// MetricName is the build-info gauge's name.
const MetricName = "kvstream_build_info"

// Collector is kvstream_build_info: a gauge that is always 1, whose labels
// say what the binary is (version, commit, goversion, protocol, and ucx:
// the libucp it runs with, or "none").
func (in Info) Collector() prometheus.Collector {
	ucx := in.UCXRuntime
	if ucx == NoUCX {
		ucx = "none"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricName,
		Help: "Always 1; the labels say which build this process runs: module version, VCS commit, Go release, control protocol version, UCX library version (none without UCX).",
		ConstLabels: prometheus.Labels{"version": in.Version, "commit": in.Commit, "goversion": in.GoVersion,
			"protocol": strconv.FormatUint(uint64(in.Protocol), 10), "ucx": ucx},
	})
	g.Set(1)
	return g
}
