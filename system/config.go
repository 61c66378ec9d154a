package system

import (
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
)

// Buffer is one KV tensor of the prefill pool (Config.Buffers; MLABuffers
// and KVBuffers build the usual layouts):
//
//	Name    for logs: "K3", "V3", "KV12", "MTP0"
//	Base    address of page 0, in memory the transport can register
//	ItemLen bytes of ONE page of this buffer, 1 to MaxItemLen (256 MiB)
//	Pages   capacity in pages, 1 to MaxPages (16 Mi); Base + ItemLen ×
//	        Pages must not wrap around the address space
//	Layer   the hook layer whose LayerEnd follows this buffer's write; a
//	        layer outside [0, HookLayers) fires no hook (the MTP layer) and
//	        its buffers are sent at the end of the forward
type Buffer = plan.Buffer

// Defaults, as in the seed implementation.
const (
	DefaultGroupSize     = 8
	DefaultSubmitters    = 4
	DefaultFinishTimeout = 30 * time.Second
	DefaultMaxRestarts   = 10
	DefaultRestartWindow = 10 * time.Second
)

// Bounds New checks a Config against: each well above what a real
// deployment reaches, and low enough that what the engine sizes from it (a
// table per hook layer and per group, a submitter actor each, the pool's
// registration) stays small. They are the bounds of a trace's header
// (package trace), so that every engine's configuration can be recorded
// and replayed.
const (
	MaxHookLayers = trace.MaxHookLayers // Config.HookLayers: 4096
	MaxSubmitters = trace.MaxSubmitters // Config.Submitters, KVSTREAM_SUBMITTERS: 1024
	MaxPageSize   = trace.MaxPageSize   // Config.PageSize, tokens: 1<<16
	MaxCPSize     = trace.MaxCPSize     // Config.CP.Size: 1024
	MaxPages      = trace.MaxPages      // a Buffer's Pages: 1<<24
	MaxItemLen    = trace.MaxItemLen    // a Buffer's ItemLen, bytes: 1<<28
)

// Environment variables that override the defaults (not explicit Config
// fields).
const (
	EnvPerLayer      = "KVSTREAM_PER_LAYER"      // 0/false turns per-layer streaming off
	EnvGroupSize     = "KVSTREAM_GROUP_SIZE"     // layers per submit
	EnvSubmitters    = "KVSTREAM_SUBMITTERS"     // submitter actors
	EnvFinishTimeout = "KVSTREAM_FINISH_TIMEOUT" // Go duration ("30s") or seconds ("30")
)

// Config describes the prefill side. Zero fields take the environment
// variable of the same knob if set, else the default.
type Config struct {
	// Buffers is the prefill pool, one entry per KV tensor; see MLABuffers
	// and KVBuffers.
	Buffers []Buffer
	// HookLayers is F: the model calls LayerEnd for layers 0..F-1. Buffers
	// whose layer is outside that range (the MTP layer) are sent at the end.
	// 1 to MaxHookLayers (4096).
	HookLayers int
	// GroupSize is K: consecutive hook layers per submit (default 8).
	GroupSize int
	// AutoGroup, when set, chooses K from a model of the link and the
	// forward (ChooseGroup; Engine.GroupChoice says what it chose and
	// why). GroupSize must then be zero: both set is ErrBadInput. Without
	// it a zero GroupSize still means KVSTREAM_GROUP_SIZE or 8.
	AutoGroup *GroupModel
	// PageSize is tokens per page: 1 to MaxPageSize (65536).
	PageSize int
	// CP is this rank's context-parallel group (zero means a group of one);
	// its Size is at most MaxCPSize (1024).
	CP cp.CP
	// Submitters is the size of the submitter pool (default 4), at most
	// MaxSubmitters (1024): each is an actor and a transfer worker.
	Submitters int
	// FinishTimeout bounds Finish and Drop (default 30 s).
	FinishTimeout time.Duration
	// DisablePerLayer sends every room monolithically after the forward.
	DisablePerLayer bool
	// SingleDestinationPerLayer restores the reference rule of invariant 8:
	// per-layer streaming only for a room with exactly one real destination,
	// the monolithic send for a room with several. By default (false) a room
	// streams per layer to every real destination, one batch per destination
	// per group.
	SingleDestinationPerLayer bool
	// Sharding, optional, is how the prefill pool shards the model (TP, PP
	// stages, KV heads, page order: a reshard.Side) and which prefill rank
	// this engine is. With it, a peer that gives its own Sharding receives
	// what cp/reshard routes to it from this rank (head slices when the TP
	// degrees differ, layer subsets across PP stages, one latent copy per
	// decode rank with MLA): AddPeer computes the route and refuses an
	// impossible pairing. Buffers must then be this stage's layers, each
	// layer's K before its V (KVBuffers, MLABuffers), and the buffers' Layer
	// the layer within the stage. Nil: today's behaviour, every peer
	// receives the buffers one for one, whole pages.
	Sharding *Sharding
	// Replicas chooses which replica of a replicated head (TP above the KV
	// heads, the MLA latent) sends it to each decode rank; used only with
	// Sharding (default reshard.SpreadReplicas). Any other value than
	// SpreadReplicas and FirstReplica is ErrBadInput, with or without a
	// Sharding.
	Replicas reshard.ReplicaRule
	// MaxRestarts and RestartWindow bound submitter restarts (default 10
	// within 10 s, over the pool): beyond, the engine is unhealthy and
	// refuses new registrations until the rate falls back. Submitters are
	// always restarted, never stopped, so that no routed work is lost.
	MaxRestarts   int
	RestartWindow time.Duration

	// chosen is AutoGroup's choice, filled by withDefaults.
	chosen *GroupChoice
}

// MLABuffers returns one buffer per layer (MLA keeps one latent KV tensor per
// layer): buffer l starts at bases[l] and belongs to layer l.
func MLABuffers(bases []uint64, itemLen uint64, pages int) []Buffer {
	out := make([]Buffer, len(bases))
	for l, b := range bases {
		out[l] = Buffer{Name: "KV" + strconv.Itoa(l), Base: b, ItemLen: itemLen, Pages: pages, Layer: l}
	}
	return out
}

// KVBuffers returns the K buffers of every layer then the V buffers (MHA/GQA
// layout K0..K(L-1), V0..V(L-1)).
func KVBuffers(kBases, vBases []uint64, itemLen uint64, pages int) []Buffer {
	out := make([]Buffer, 0, len(kBases)+len(vBases))
	for l, b := range kBases {
		out = append(out, Buffer{Name: "K" + strconv.Itoa(l), Base: b, ItemLen: itemLen, Pages: pages, Layer: l})
	}
	for l, b := range vBases {
		out = append(out, Buffer{Name: "V" + strconv.Itoa(l), Base: b, ItemLen: itemLen, Pages: pages, Layer: l})
	}
	return out
}

// CheckEnv validates the environment variables the engine reads
// (EnvGroupSize, EnvSubmitters, EnvFinishTimeout, EnvPerLayer) as New
// does: a malformed one is an error marked ErrBadInput that names it and
// its value. A command calls it before any work, so that a bad variable
// fails it at once even where its flags set the knob the variable
// overrides.
func CheckEnv() error { return checkEnv(os.Getenv) }

func checkEnv(getenv func(string) string) error {
	if _, err := envInt(getenv, EnvGroupSize, 1, math.MaxInt); err != nil {
		return err
	}
	if _, err := envInt(getenv, EnvSubmitters, 1, MaxSubmitters); err != nil {
		return err
	}
	if _, err := envDuration(getenv, EnvFinishTimeout, DefaultFinishTimeout); err != nil {
		return err
	}
	_, err := envBool(getenv, EnvPerLayer, true)
	return err
}

// withDefaults fills zero fields from the environment, then the defaults. A
// malformed variable is an error that names it and its value, whether or
// not a field overrides it (checkEnv).
func (c Config) withDefaults(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if err := checkEnv(getenv); err != nil {
		return c, err
	}
	if c.CP.Size == 0 {
		c.CP.Size = 1
	}
	// Hook layers first: AutoGroup's model, and New after it, size tables
	// from them.
	switch {
	case c.HookLayers < 1:
		return c, badInput("hook layers %d: must be at least 1", c.HookLayers)
	case c.HookLayers > MaxHookLayers:
		return c, badInput("hook layers %d: must be at most %d", c.HookLayers, MaxHookLayers)
	}
	var err error
	if c.AutoGroup != nil {
		if c.GroupSize != 0 {
			return c, badInput("group size %d and AutoGroup both set: give one", c.GroupSize)
		}
		ch, err := ChooseGroup(*c.AutoGroup, c.Buffers, c.HookLayers)
		if err != nil {
			return c, err
		}
		c.GroupSize, c.chosen = ch.K, &ch
	}
	if c.GroupSize == 0 {
		if c.GroupSize, err = envInt(getenv, EnvGroupSize, DefaultGroupSize, math.MaxInt); err != nil {
			return c, err
		}
	}
	if c.Submitters == 0 {
		if c.Submitters, err = envInt(getenv, EnvSubmitters, DefaultSubmitters, MaxSubmitters); err != nil {
			return c, err
		}
	}
	if c.FinishTimeout == 0 {
		if c.FinishTimeout, err = envDuration(getenv, EnvFinishTimeout, DefaultFinishTimeout); err != nil {
			return c, err
		}
	}
	if !c.DisablePerLayer {
		on, err := envBool(getenv, EnvPerLayer, true)
		if err != nil {
			return c, err
		}
		c.DisablePerLayer = !on
	}
	if c.MaxRestarts == 0 {
		c.MaxRestarts = DefaultMaxRestarts
	}
	if c.RestartWindow == 0 {
		c.RestartWindow = DefaultRestartWindow
	}
	switch {
	case c.Submitters < 1:
		return c, badInput("submitters %d: must be at least 1", c.Submitters)
	case c.Submitters > MaxSubmitters:
		// One actor and transfer worker each, started by New.
		return c, badInput("submitters %d: must be at most %d", c.Submitters, MaxSubmitters)
	case c.FinishTimeout <= 0:
		return c, badInput("finish timeout %v: must be positive", c.FinishTimeout)
	case c.FinishTimeout > maxDuration:
		return c, badInput("finish timeout %v: must be at most %v", c.FinishTimeout, maxDuration)
	case c.GroupSize < 1:
		return c, badInput("group size %d: must be at least 1", c.GroupSize)
	case c.PageSize > MaxPageSize:
		return c, badInput("page size %d: must be at most %d", c.PageSize, MaxPageSize)
	case c.CP.Size > MaxCPSize:
		return c, badInput("CP size %d: must be at most %d", c.CP.Size, MaxCPSize)
	case c.Replicas != reshard.SpreadReplicas && c.Replicas != reshard.FirstReplica:
		return c, badInput("replicas %d: unknown: want %d (reshard.SpreadReplicas) or %d (reshard.FirstReplica)", int(c.Replicas), reshard.SpreadReplicas, reshard.FirstReplica)
	case c.MaxRestarts < 0:
		// Negative, every restart count is a storm: the engine would
		// refuse every registration as unhealthy.
		return c, badInput("max restarts %d: must be at least 0 (0: the default, %d)", c.MaxRestarts, DefaultMaxRestarts)
	case c.RestartWindow < 0:
		return c, badInput("restart window %v: must be positive (0: the default, %v)", c.RestartWindow, DefaultRestartWindow)
	}
	return c, nil
}

// policy is the register guard's policy the configuration asks for.
func (c Config) policy() cp.Policy {
	switch {
	case c.DisablePerLayer:
		return cp.NoPerLayer
	case c.SingleDestinationPerLayer:
		return cp.SingleDestination
	}
	return cp.EveryDestination
}

// getenv returns the environment lookup a Config uses.
func (c Config) getenv(f func(string) string) func(string) string {
	if f == nil {
		return os.Getenv
	}
	return f
}

// envInt reads a positive integer variable of at most hi.
func envInt(getenv func(string) string, name string, def, hi int) (int, error) {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	switch {
	case err != nil || n < 1:
		return 0, badInput("%s=%q: want a positive integer", name, v)
	case n > hi:
		return 0, badInput("%s=%q: want a positive integer of at most %d", name, v, hi)
	}
	return n, nil
}

// maxDuration bounds a duration variable: a call waits for its timeout
// plus a grace (finishGrace), which must not overflow.
const maxDuration = time.Duration(math.MaxInt64) - finishGrace

func envDuration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return def, nil
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		// Bounded before the conversion: a float beyond int64 (1e10 s,
		// Inf) converts to a negative duration, and one under a
		// nanosecond to zero; either would reach the engine's own check,
		// which does not name the variable (and CheckEnv passed it).
		switch ns := secs * float64(time.Second); {
		case ns >= 1 && ns <= float64(maxDuration):
			return time.Duration(ns), nil
		case ns > 0 && ns < 1:
			return 0, badInput("%s=%q: want a positive duration such as 30s, of at least 1ns", name, v)
		case ns > float64(maxDuration):
			return 0, badInput("%s=%q: want a positive duration such as 30s, of at most %v", name, v, maxDuration)
		}
		return 0, badInput("%s=%q: want a positive duration such as 30s", name, v)
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil || d <= 0:
		return 0, badInput("%s=%q: want a positive duration such as 30s", name, v)
	case d > maxDuration:
		return 0, badInput("%s=%q: want a positive duration such as 30s, of at most %v", name, v, maxDuration)
	}
	return d, nil
}

func envBool(getenv func(string) string, name string, def bool) (bool, error) {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badInput("%s=%q: want 1/0 or true/false", name, v)
	}
	return b, nil
}

func badInput(format string, args ...any) error {
	return errors.Mark(errors.Newf(format, args...), ErrBadInput)
}
