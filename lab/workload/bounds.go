package workload

import (
	"math"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
)

// MaxModeledNs is the longest duration, in nanoseconds, that a run may
// model: time.Duration's range (about 292 years; the link and the virtual
// GPU hold a longer one at that, see loopback.Options.LinkTime), less a
// relative 1e-9 for the rounding of the models' float arithmetic, which
// compute the same times by other expressions than checkModeledTime.
const MaxModeledNs = float64(loopback.MaxModeled) * (1 - 1e-9)

// durationRange is MaxModeledNs in words, for errors.
const durationRange = "time.Duration's range, about 292 years"

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
	// The sharding degrees, sharded run or not: a negative one once ran
	// unsharded and succeeded. PP is bounded by the model's layers too
	// (shardedGeometry), before a stage list is sized from it.
	for _, d := range []struct {
		flag   string
		v, max int
	}{{"--prefill-tp", c.PrefillTP, reshard.MaxTP}, {"--decode-tp", c.DecodeTP, reshard.MaxTP},
		{"--prefill-pp", c.PrefillPP, reshard.MaxLayers}, {"--decode-pp", c.DecodePP, reshard.MaxLayers}} {
		if d.v < 0 || d.v > d.max {
			return errors.Mark(errors.Newf("%s %d: must be within [0, %d] (0: unsharded)", d.flag, d.v, d.max), system.ErrBadInput)
		}
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

// modeledSpan is what bounds every duration a run models: its compute
// (every token of every request through every layer at the compute
// model's rate, back to back: a layer's kernel over t tokens takes
// t × us/1000 µs, t × us ns), the bytes it sends (every page of every
// request, to every decode rank, at their real size: a batch, a chunk, or
// the whole run on one link, as the ideal floor puts them, takes at most
// their time over the link) and the link latency. A kernel, a batch, a
// floor's instant and each of them as wall time are no longer than that
// span (as wall time: over --time-scale).
type modeledSpan struct {
	tokens, layers float64 // the compute: tokens through layers
	usPerKTok      float64
	bytes          float64 // every byte sent, real size
}

func (c Config) modeledSpan(g geometry) modeledSpan {
	us := c.Preset.LayerUsPerKTok
	if c.LayerUsPerKTok > 0 {
		us = c.LayerUsPerKTok
	}
	perPage := float64(g.pageBytes) * float64(g.buffers)
	if g.sharded {
		// Whichever side holds more: a replicated MLA latent goes to every
		// decode TP rank.
		pre, dec := g.preReal, g.decReal
		perPage = max(float64(pre.TP)*float64(pre.ItemLen()), float64(dec.TP)*float64(dec.ItemLen())) * float64(g.buffers)
	}
	return modeledSpan{
		tokens: float64(c.Requests) * float64(c.PromptTokens), layers: float64(g.layers), usPerKTok: us,
		bytes: perPage * float64(g.pagesPerRequest) * float64(c.Requests),
	}
}

// modeledBudget is the longest modeled span a run may have: MaxModeledNs,
// as wall time too (modeled time over --time-scale), so less when time
// runs slower than the model.
func (c Config) modeledBudget() float64 { return MaxModeledNs * min(c.TimeScale, 1) }

// maxLayerUsPerKTok is the bound on --layer-us-per-ktok for c: at it, c's
// compute and link latency alone fill the longest span a run may model
// (see checkModeledTime).
func (c Config) maxLayerUsPerKTok(s modeledSpan) float64 {
	return (c.modeledBudget() - float64(c.LinkLatency)) / (s.layers * s.tokens)
}

// minLinkGbps is the bound on --link-gbps for c: at it, every byte the run
// sends, on one link after its compute and latency, takes the longest
// span a run may model (bits over Gb/s is nanoseconds).
func (c Config) minLinkGbps(s modeledSpan) float64 {
	compute := s.layers * s.tokens * s.usPerKTok
	return 8 * s.bytes / (c.modeledBudget() - compute - float64(c.LinkLatency))
}

// checkModeledTime refuses a run that would model a duration beyond what a
// time.Duration holds: the model's conversion wrapped it (kvstream sim
// --link-gbps 1e-15 reported 0.46 ms of transfer for hours of modeled
// time). The run's modeled span (see modeledSpan) must stay under
// MaxModeledNs, as wall time too; the bound each error gives is exact for
// that span: --layer-us-per-ktok (the compute alone), then --link-gbps
// (what the compute leaves to the link). --time-scale and
// --link-latency-us are bounded on their own (checkBounds) and enter both.
func (c Config) checkModeledTime(g geometry) error {
	s := c.modeledSpan(g)
	if s.tokens == 0 || s.layers == 0 {
		return nil
	}
	if maxUs := c.maxLayerUsPerKTok(s); s.usPerKTok >= maxUs {
		return errors.Newf("--layer-us-per-ktok %v: must be below %.6g for this run: %.0f tokens through %.0f layers would model more compute than a duration holds (%s) at --time-scale %v",
			s.usPerKTok, maxUs, s.tokens, s.layers, durationRange, c.TimeScale)
	}
	if minGbps := c.minLinkGbps(s); c.LinkGbps <= minGbps {
		return errors.Newf("--link-gbps %v: must be above %.6g Gb/s for this run: its %.0f bytes on one link, after its modeled compute, would take longer than a duration holds (%s) at --time-scale %v",
			c.LinkGbps, minGbps, s.bytes, durationRange, c.TimeScale)
	}
	return nil
}
