package workload

import (
	"math"
	"time"

	"github.com/cockroachdb/errors"
)

// Upper bounds of a sim run, checked before anything is sized from the
// flags. Each is far above a realistic run and low enough that what the sim
// allocates from it (pools, schedules, staging, per-request reports) stays
// within a laptop's memory; the products are checked too, so nothing wraps.
const (
	// MaxRequests: the sim keeps a schedule entry and a report row per
	// request (a few hundred bytes); the pools hold only the resident
	// requests' pages (Config.Resident).
	MaxRequests = 1 << 16
	// MaxTokens bounds a prompt and a forward's chunk: 16 Mi tokens, far
	// beyond any served context.
	MaxTokens = 1 << 24
	// MaxPagesPerRun bounds every request's pages together: the schedule
	// holds an entry per chunk, and a chunk can be a single page.
	MaxPagesPerRun = 1 << 22
	// MaxLayers bounds --layers: served models have a few hundred.
	MaxLayers = 4096
	// MaxPageSize bounds --page-size (serving stacks use 1 to 256 tokens).
	MaxPageSize = 1 << 16
	// MaxSubmitters bounds --submitters (the engine's default is 4).
	MaxSubmitters = 1024
	// MaxScale bounds --scale (bytes per page are divided by it).
	MaxScale = 1 << 20
	// MaxLinkGbps bounds --link-gbps: 100 Tb/s, past any NIC.
	MaxLinkGbps = 100_000
	// MinTimeScale and MaxTimeScale bound --time-scale: outside, modeled
	// durations round to nothing or to hours of wall time.
	MinTimeScale, MaxTimeScale = 1e-3, 1e3
	// MaxLatency bounds --link-latency.
	MaxLatency = time.Second
	// MaxLayerUsPerKTok bounds --layer-us-per-ktok: a second per thousand
	// tokens per layer.
	MaxLayerUsPerKTok = 1e6
	// MaxMemoryBudget bounds the memory the sim may hold for KV pools.
	MaxMemoryBudget = 64 << 30
	// MaxPoolBytes bounds one side's KV pool as it will be allocated, after
	// --scale (which cannot shrink a page below 8 bytes).
	MaxPoolBytes = 1 << 30
)

// checkBounds refuses a configuration that no real run has, naming the flag
// and the bound, before anything is allocated from it. NaN and infinities
// are refused where a float comes in.
func (c Config) checkBounds() error {
	finite := func(flag string, v float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return errors.Newf("%s %v: must be a finite number", flag, v)
		}
		return nil
	}
	for _, f := range []struct {
		flag string
		v    float64
	}{{"--link-gbps", c.LinkGbps}, {"--time-scale", c.TimeScale}, {"--layer-us-per-ktok", c.LayerUsPerKTok}} {
		if err := finite(f.flag, f.v); err != nil {
			return err
		}
	}
	switch {
	case c.Requests > MaxRequests:
		return errors.Newf("--requests %d: above the bound of %d", c.Requests, MaxRequests)
	case c.Resident > MaxRequests:
		return errors.Newf("--resident %d: above the bound of %d", c.Resident, MaxRequests)
	case c.PromptTokens > MaxTokens:
		return errors.Newf("--prompt-tokens %d: above the bound of %d", c.PromptTokens, MaxTokens)
	case c.ChunkTokens > MaxTokens:
		return errors.Newf("--chunk-tokens %d: above the bound of %d", c.ChunkTokens, MaxTokens)
	case c.PageSize > MaxPageSize:
		return errors.Newf("--page-size %d: above the bound of %d", c.PageSize, MaxPageSize)
	case c.Layers > MaxLayers:
		return errors.Newf("--layers %d: above the bound of %d", c.Layers, MaxLayers)
	case c.GroupSize > MaxLayers:
		return errors.Newf("--group %d: above the bound of %d", c.GroupSize, MaxLayers)
	case c.Submitters < 1 || c.Submitters > MaxSubmitters:
		return errors.Newf("--submitters %d: must be within [1, %d]", c.Submitters, MaxSubmitters)
	case c.Scale > MaxScale:
		return errors.Newf("--scale %d: above the bound of %d", c.Scale, MaxScale)
	case c.LinkGbps > MaxLinkGbps:
		return errors.Newf("--link-gbps %v: above the bound of %d", c.LinkGbps, MaxLinkGbps)
	case c.TimeScale != 0 && (c.TimeScale < MinTimeScale || c.TimeScale > MaxTimeScale):
		return errors.Newf("--time-scale %v: must be within [%v, %v]", c.TimeScale, MinTimeScale, MaxTimeScale)
	case c.LinkLatency < 0 || c.LinkLatency > MaxLatency:
		return errors.Newf("--link-latency %v: must be within [0, %v]", c.LinkLatency, MaxLatency)
	case c.LayerUsPerKTok < 0 || c.LayerUsPerKTok > MaxLayerUsPerKTok:
		return errors.Newf("--layer-us-per-ktok %v: must be within [0, %v]", c.LayerUsPerKTok, MaxLayerUsPerKTok)
	case c.FinishTimeout < 0:
		return errors.Newf("--finish-timeout %v: must not be negative", c.FinishTimeout)
	case c.MemoryBudget < 0 || c.MemoryBudget > MaxMemoryBudget:
		return errors.Newf("memory budget %d bytes: must be within [0, %d]", c.MemoryBudget, int64(MaxMemoryBudget))
	}
	if c.PageSize > 0 && c.Requests > 0 {
		pages := (c.PromptTokens + c.PageSize - 1) / c.PageSize // both factors bounded: no overflow
		if int64(pages)*int64(c.Requests) > MaxPagesPerRun {
			return errors.Newf("--requests %d x --prompt-tokens %d: %d pages of %d tokens, above the bound of %d pages per run",
				c.Requests, c.PromptTokens, int64(pages)*int64(c.Requests), c.PageSize, MaxPagesPerRun)
		}
	}
	return nil
}
