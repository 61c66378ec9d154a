package soak

import (
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/workload"
	"go.uber.org/zap"
)

// Kind is a kind of episode.
type Kind string

// The kinds of episodes. The main lane's run one after another, each a
// kvstream prefill process; the side lane's run in the soak's process (a
// vanish in a process of its own) beside them.
const (
	Clean       Kind = "clean"
	Kill        Kind = "kill"
	Stop        Kind = "stop"
	PauseDecode Kind = "pause-decode"
	Vanish      Kind = "vanish"
	Refused     Kind = "refused"
	ByeWriter   Kind = "bye-writer"
)

var (
	// MainKinds are the main lane's kinds, in the order reports list them.
	MainKinds = []Kind{Clean, Kill, Stop, PauseDecode}
	// SideKinds are the side lane's kinds.
	SideKinds = []Kind{Vanish, Refused, ByeWriter}
)

// Kinds is every kind, main lane first.
func Kinds() []Kind { return slices.Concat(MainKinds, SideKinds) }

// Mix is each kind's weight: after every kind of positive weight ran once,
// a lane picks its next kind at random in proportion to them. A kind
// missing from the map has weight 0 (never runs).
type Mix map[Kind]int

// DefaultMix is --mix's default.
const DefaultMix = "clean=4,kill=2,stop=2,pause-decode=1,vanish=1,refused=1,bye-writer=1"

// MaxWeight bounds a weight of --mix.
const MaxWeight = 1000

// ParseMix reads --mix: comma-separated kind=weight pairs, each kind at
// most once; kinds not named do not run. At least one main-lane kind needs
// a positive weight; a side lane of zero weights does not run.
func ParseMix(s string) (Mix, error) {
	m := Mix{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, ok := strings.Cut(part, "=")
		k := Kind(strings.TrimSpace(name))
		if !ok {
			return nil, errors.Newf("--mix %q: %q is not kind=weight", s, part)
		}
		if !slices.Contains(Kinds(), k) {
			return nil, errors.Newf("--mix %q: unknown kind %q: want %s", s, k, kindList(Kinds()))
		}
		if _, dup := m[k]; dup {
			return nil, errors.Newf("--mix %q: %s given twice", s, k)
		}
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 0 || n > MaxWeight {
			return nil, errors.Newf("--mix %q: %s=%s: want a weight from 0 to %d", s, k, strings.TrimSpace(w), MaxWeight)
		}
		m[k] = n
	}
	if m.total(MainKinds) == 0 {
		return nil, errors.Newf("--mix %q: no main-lane kind (%s) has a positive weight", s, kindList(MainKinds))
	}
	return m, nil
}

// String is the mix as --mix spells it, every kind of positive weight in
// the order of Kinds.
func (m Mix) String() string {
	var parts []string
	for _, k := range Kinds() {
		if m[k] > 0 {
			parts = append(parts, string(k)+"="+strconv.Itoa(m[k]))
		}
	}
	return strings.Join(parts, ",")
}

func (m Mix) total(kinds []Kind) int {
	n := 0
	for _, k := range kinds {
		n += m[k]
	}
	return n
}

func kindList(ks []Kind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Bounds are the growth of the decode process between the start and end
// figures that fails the report.
type Bounds struct {
	RSSGrowthMiB    float64 `json:"max_rss_growth_mib"`
	FDGrowth        int     `json:"max_fd_growth"`
	GoroutineGrowth int     `json:"max_goroutine_growth"`
}

// DefaultBounds are the flags' defaults: above what a settled decode
// varies by (its heap, a connection being set up), far below what one
// leaked pool or worker per session adds up to over a soak.
var DefaultBounds = Bounds{RSSGrowthMiB: 64, FDGrowth: 4, GoroutineGrowth: 16}

// Workload is what every main-lane prefill runs: the sim's small model
// (8 layers and the MTP layer), a few short requests, its modeled compute
// slow enough that a run lasts about a second (a window for the faults)
// while the CPU mostly waits.
type Workload struct {
	Requests, PromptTokens, ChunkTokens, PageSize int
	// Scale divides the bytes of a page (the sim's --scale): the decode's
	// pool stays a few MiB, so that its memory figures show leaks rather
	// than the pool.
	Scale          int
	LayerUsPerKTok float64
}

// DefaultWorkload is the soak's default prefill: 3 requests of 1024
// tokens in 6 forwards of 512, pages of 16 tokens at a quarter of their
// bytes (a pool of about 8 MiB).
var DefaultWorkload = Workload{Requests: 3, PromptTokens: 1024, ChunkTokens: 512, PageSize: 16, Scale: 4, LayerUsPerKTok: 20000}

// Flags are the workload as kvstream prefill's flags (and the soak's
// vanish helper's).
func (w Workload) Flags() []string {
	return []string{"--requests", strconv.Itoa(w.Requests), "--prompt-tokens", strconv.Itoa(w.PromptTokens),
		"--chunk-tokens", strconv.Itoa(w.ChunkTokens), "--page-size", strconv.Itoa(w.PageSize),
		"--scale", strconv.Itoa(w.Scale), "--layer-us-per-ktok", strconv.FormatFloat(w.LayerUsPerKTok, 'g', -1, 64)}
}

// Config is the prefill command's configuration for w (every request
// resident, so that each owns its decode pages: see Layout).
func (w Workload) Config(seed uint64) workload.Config {
	c := workload.Defaults()
	c.Preset = workload.Presets["small"]
	c.Requests, c.PromptTokens, c.ChunkTokens, c.PageSize = w.Requests, w.PromptTokens, w.ChunkTokens, w.PageSize
	c.Scale, c.LayerUsPerKTok, c.Resident, c.Seed = w.Scale, w.LayerUsPerKTok, w.Requests, seed
	return c
}

// Layout is the pool the prefills' Hello describes and each request's
// decode pages by position (workload.Config.RemoteLayout). Every request
// is resident, so no two requests share a page: a page only ever holds
// one room's bytes, which the bye-writer writes too.
func (w Workload) Layout(seed uint64) (testbed.Geometry, [][]int, error) {
	if w.Scale < 1 {
		return testbed.Geometry{}, nil, errors.Newf("--scale %d: must be at least 1", w.Scale)
	}
	if !(w.LayerUsPerKTok > 0) || w.LayerUsPerKTok > 1e6 {
		return testbed.Geometry{}, nil, errors.Newf("--layer-us-per-ktok %v: want more than 0, at most 1e6", w.LayerUsPerKTok)
	}
	return w.Config(seed).RemoteLayout()
}

// Config configures a soak. Its errors name the flags of kvstream soak.
type Config struct {
	// Command makes the command that runs the kvstream binary with args
	// (the CLI: its own executable; a test: its own re-execution). The
	// soak sets its output and starts it.
	Command func(args ...string) *exec.Cmd
	// Open opens one side of a transport by kind ("ucx"), for the side
	// lane's bye-writer (as xferbench.Config.Open).
	Open func(kind, name string) (rdma.Transport, error)
	// For bounds the main lane's time (the warm-up not counted); Episodes,
	// if positive, its episodes: whichever comes first.
	For      time.Duration
	Episodes int
	// Seed seeds the choices (kinds, instants) and the prefills' bytes.
	Seed uint64
	Mix  Mix
	// Bounds fail the report when the decode grew by more.
	Bounds Bounds
	// Heartbeat is every process's --heartbeat (the decode's and the
	// prefills'), and the side lane's: the bound within which a silent
	// peer is declared lost. A pause-decode stops the decode for twice as
	// long.
	Heartbeat time.Duration
	// Settle is how long after the decode ended its last session the start
	// and end figures are taken: a revoked UCX worker lingers 2 s.
	Settle time.Duration
	// ByeWriterFor is how long a bye-writer goes on writing after its Bye
	// returned (default 3 s: past the 2 s a revoked worker answers
	// refusals, into its destruction).
	ByeWriterFor time.Duration
	Workload     Workload
	// Log, if set, receives a line per episode and what a crashed or
	// misbehaving process printed.
	Log io.Writer
	// DecodeOutput, if set, receives every line the decode process prints
	// (its log at DEBUG, UCX's, a crash's backtrace).
	DecodeOutput io.Writer
	// Logger logs the soak's own control plane (default: nothing).
	Logger *zap.Logger
}

// Bounds of the flags.
const (
	maxFor       = 24 * time.Hour
	minHeartbeat = 500 * time.Millisecond
	maxHeartbeat = time.Minute
	maxSettle    = time.Minute
)

// Check checks c, naming the flag of a bad value, and fills in its
// defaults (Run calls it).
func (c *Config) Check() error {
	switch {
	case c.Command == nil:
		return errors.New("soak: Config.Command is nil: it starts the kvstream binary")
	case c.For <= 0 || c.For > maxFor:
		return errors.Newf("--for %v: want more than 0, at most %v", c.For, maxFor)
	case c.Episodes < 0:
		return errors.Newf("--episodes %d: must not be negative (0: no limit)", c.Episodes)
	case c.Mix.total(MainKinds) == 0:
		return errors.Newf("--mix %q: no main-lane kind (%s) has a positive weight", c.Mix, kindList(MainKinds))
	case c.Mix[ByeWriter] > 0 && c.Open == nil:
		return errors.New("soak: --mix has bye-writer but Config.Open is nil: it opens the writer's transport")
	case c.Heartbeat < minHeartbeat || c.Heartbeat > maxHeartbeat:
		return errors.Newf("--heartbeat %v: want %v to %v", c.Heartbeat, minHeartbeat, maxHeartbeat)
	case c.Settle < 0 || c.Settle > maxSettle:
		return errors.Newf("--settle %v: want 0 to %v", c.Settle, maxSettle)
	case !(c.Bounds.RSSGrowthMiB >= 0) || c.Bounds.RSSGrowthMiB > 1<<20:
		return errors.Newf("--max-rss-growth-mib %v: want 0 to %d", c.Bounds.RSSGrowthMiB, 1<<20)
	case c.Bounds.FDGrowth < 0:
		return errors.Newf("--max-fd-growth %d: must not be negative", c.Bounds.FDGrowth)
	case c.Bounds.GoroutineGrowth < 0:
		return errors.Newf("--max-goroutine-growth %d: must not be negative", c.Bounds.GoroutineGrowth)
	case c.ByeWriterFor < 0 || c.ByeWriterFor > time.Minute:
		return errors.Newf("soak: Config.ByeWriterFor %v: want 0 (3 s) to 1m", c.ByeWriterFor)
	}
	for k := range c.Mix {
		if !slices.Contains(Kinds(), k) {
			return errors.Newf("--mix: unknown kind %q: want %s", k, kindList(Kinds()))
		}
	}
	if c.ByeWriterFor == 0 {
		c.ByeWriterFor = 3 * time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	_, _, err := c.Workload.Layout(c.Seed)
	return err
}
