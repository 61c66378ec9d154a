package system

import (
	"fmt"
	"math"
	"time"
)

// Defaults of GroupModel.
const (
	// DefaultBatchOverhead is a batch's host cost (event detection, block
	// building, the post) that GroupModel charges before it reaches the
	// link: an upper bound on the engine's detect and post phases, which
	// are tens of microseconds at p50 (docs/PERFORMANCE.md).
	DefaultBatchOverhead = 50 * time.Microsecond
	// DefaultMaxBatches bounds the batches per forward a chosen group size
	// may cost (groups plus the hookless buffers' batch), per destination.
	DefaultMaxBatches = 16
)

// GroupModel is what Config.AutoGroup chooses the group size K from: a
// model of one forward of PagesPerForward pages, whose layers each take
// LayerTime, on a link of LinkBytesPerSec and Latency. The bytes of a
// layer come from the Buffers (ItemLen × pages, times ItemScale).
type GroupModel struct {
	// LinkBytesPerSec is the link's rate (bytes of the model's KV per
	// second); Latency is added to each batch's landing.
	LinkBytesPerSec float64
	Latency         time.Duration
	// PagesPerForward is how many pages a typical forward writes per
	// buffer (its token budget over the page size).
	PagesPerForward int
	// LayerTime is one layer's compute in such a forward.
	LayerTime time.Duration
	// BatchOverhead is each batch's host cost before it is on the link
	// (zero: DefaultBatchOverhead).
	BatchOverhead time.Duration
	// MaxBatches bounds the batches per forward (zero: DefaultMaxBatches).
	MaxBatches int
	// ItemScale is the model's bytes per byte of a buffer's ItemLen (zero
	// means 1): a simulation keeps pages smaller than the model's. Finite
	// and not negative; so is LinkBytesPerSec, and positive. The modeled
	// forward (its layers, their bytes on the link, the overhead and the
	// latency) must stay within a Duration's range.
	ItemScale float64
}

// GroupCandidate is the model's outcome for one K.
type GroupCandidate struct {
	K       int `json:"k"`
	Batches int `json:"batches_per_forward"`
	// LastGroupSlack is how long before the forward's end the last group
	// lands (negative: after it, exposed).
	LastGroupSlack time.Duration `json:"last_group_slack_ns"`
	// Exposed is the modeled time from the forward's end to the last
	// batch's landing.
	Exposed time.Duration `json:"exposed_ns"`
}

// GroupChoice is the group size AutoGroup chose, and why.
type GroupChoice struct {
	K          int              `json:"k"`
	Reason     string           `json:"reason"`
	Candidates []GroupCandidate `json:"candidates"`
}

// maxHorizon bounds the modeled length of one forward and its sends: every
// instant the model computes (a layer's end, a batch's start, its landing)
// is at most it, with room to spare below the int64 nanoseconds of a
// Duration for the rounding of its float link times.
const maxHorizon = time.Duration(1 << 62)

// checkHorizon checks that the model of a forward of layers layers stays
// within maxHorizon, before it is computed: a product or sum beyond a
// Duration wrapped around to a meaningless K (a layer time of
// math.MaxInt64/2, a link rate or item scale that makes a layer's bytes
// take longer than a Duration holds). The error names the field.
func checkHorizon(m *GroupModel, layers int, bytes []float64, hookless float64) error {
	if m.LayerTime > 0 && int64(layers) > int64(maxHorizon/m.LayerTime) {
		return badInput("auto group: layer time %v: %d layers of it exceed %v", m.LayerTime, layers, maxHorizon)
	}
	end := time.Duration(layers) * m.LayerTime
	total := hookless
	for _, n := range bytes {
		total += n
	}
	// Each buffer's bytes are finite and not negative (finite factors),
	// but their product or sum may reach +Inf; so may the link time.
	link := total / m.LinkBytesPerSec * float64(time.Second)
	if !(link <= float64(maxHorizon)) {
		return badInput("auto group: link rate %v bytes/s, item scale %v: %.4g bytes per forward take %.4g s, beyond %v",
			m.LinkBytesPerSec, m.ItemScale, total, link/float64(time.Second), maxHorizon)
	}
	if float64(end)+float64(m.BatchOverhead)+float64(m.Latency)+link > float64(maxHorizon) {
		return badInput("auto group: layer time %v × %d layers, batch overhead %v, latency %v and %v on the link exceed %v",
			m.LayerTime, layers, m.BatchOverhead, m.Latency, time.Duration(link), maxHorizon)
	}
	return nil
}

// ChooseGroup picks K for buffers (hook layers 0..hookLayers-1, the rest
// hookless) under m: the smallest K within the batch bound whose last group
// lands before the forward ends (it hides under the hookless layers, and a
// small K leaves the least to send after its group's layer); if none does,
// the K of least modeled exposed time (the fewer batches on a tie).
func ChooseGroup(m GroupModel, buffers []Buffer, hookLayers int) (GroupChoice, error) {
	switch {
	case hookLayers < 1:
		return GroupChoice{}, badInput("auto group: hook layers %d: must be at least 1", hookLayers)
	case hookLayers > MaxHookLayers:
		// The model tries every K up to it, each over every layer.
		return GroupChoice{}, badInput("auto group: hook layers %d: must be at most %d", hookLayers, MaxHookLayers)
	case !(m.LinkBytesPerSec > 0) || math.IsInf(m.LinkBytesPerSec, 0): // NaN is not > 0
		return GroupChoice{}, badInput("auto group: link rate %v bytes/s: must be positive and finite", m.LinkBytesPerSec)
	case m.PagesPerForward < 1:
		return GroupChoice{}, badInput("auto group: pages per forward %d: must be at least 1", m.PagesPerForward)
	case m.LayerTime < 0:
		return GroupChoice{}, badInput("auto group: layer time %v: must not be negative", m.LayerTime)
	case m.Latency < 0:
		return GroupChoice{}, badInput("auto group: latency %v: must not be negative", m.Latency)
	case m.BatchOverhead < 0:
		return GroupChoice{}, badInput("auto group: batch overhead %v: must not be negative (0: the default, %v)", m.BatchOverhead, DefaultBatchOverhead)
	case m.MaxBatches < 0:
		return GroupChoice{}, badInput("auto group: max batches %d: must not be negative (0: the default, %d)", m.MaxBatches, DefaultMaxBatches)
	case !(m.ItemScale >= 0) || math.IsInf(m.ItemScale, 0): // NaN is not >= 0
		return GroupChoice{}, badInput("auto group: item scale %v: must be positive and finite (0: 1)", m.ItemScale)
	}
	if m.BatchOverhead == 0 {
		m.BatchOverhead = DefaultBatchOverhead
	}
	if m.MaxBatches == 0 {
		m.MaxBatches = DefaultMaxBatches
	}
	if m.ItemScale == 0 {
		m.ItemScale = 1
	}
	// Bytes per hook layer per forward; layers outside the hooks (past
	// them, or negative: a sentinel for "no hook") fire no hook, are sent
	// at the forward's end, and each distinct one computes after the hooks
	// as the MTP layer does. They are counted, not indexed: a buffer's
	// layer is the caller's value, and one far past the hooks would size a
	// slice.
	bytes := make([]float64, hookLayers)
	var hookless float64
	after := map[int]bool{}
	for _, b := range buffers {
		n := float64(b.ItemLen) * float64(m.PagesPerForward) * m.ItemScale
		switch {
		case b.Layer >= 0 && b.Layer < hookLayers:
			bytes[b.Layer] += n
		default:
			hookless += n
			after[b.Layer] = true
		}
	}
	if err := checkHorizon(&m, hookLayers+len(after), bytes, hookless); err != nil {
		return GroupChoice{}, err
	}
	end := time.Duration(hookLayers+len(after)) * m.LayerTime
	onLink := func(n float64) time.Duration { return time.Duration(n / m.LinkBytesPerSec * float64(time.Second)) }

	var out GroupChoice
	for k := 1; k <= hookLayers; k++ {
		groups := (hookLayers + k - 1) / k
		c := GroupCandidate{K: k, Batches: groups}
		if hookless > 0 {
			c.Batches++
		}
		if c.Batches > m.MaxBatches {
			continue
		}
		var free, last, lastGroup time.Duration
		for g := 0; g < groups; g++ {
			lo, hi := g*k, min((g+1)*k, hookLayers)
			var n float64
			for l := lo; l < hi; l++ {
				n += bytes[l]
			}
			start := max(free, time.Duration(hi)*m.LayerTime+m.BatchOverhead)
			free = start + onLink(n)
			lastGroup = free + m.Latency
		}
		last = lastGroup
		if hookless > 0 {
			free = max(free, end+m.BatchOverhead) + onLink(hookless)
			last = free + m.Latency
		}
		c.LastGroupSlack = end - lastGroup
		c.Exposed = max(last-end, 0)
		out.Candidates = append(out.Candidates, c)
	}
	if len(out.Candidates) == 0 {
		return GroupChoice{}, badInput("auto group: no group size keeps within %d batches per forward for %d hook layers", m.MaxBatches, hookLayers)
	}
	for _, c := range out.Candidates {
		if c.LastGroupSlack >= 0 {
			out.K = c.K
			out.Reason = fmt.Sprintf("K = %d: the smallest K within %d batches per forward (%d) whose last group lands %v before the forward ends (modeled exposed %v, the hookless buffers)",
				c.K, m.MaxBatches, c.Batches, c.LastGroupSlack.Round(time.Microsecond), c.Exposed.Round(time.Microsecond))
			return out, nil
		}
	}
	best := out.Candidates[0]
	for _, c := range out.Candidates[1:] {
		if c.Exposed < best.Exposed || (c.Exposed == best.Exposed && c.Batches < best.Batches) {
			best = c
		}
	}
	out.K = best.K
	out.Reason = fmt.Sprintf("K = %d: no K within %d batches per forward hides its last group (K = %d's lands %v after the forward's end); this one has the least modeled exposed time, %v, in %d batches",
		best.K, m.MaxBatches, best.K, (-best.LastGroupSlack).Round(time.Microsecond), best.Exposed.Round(time.Microsecond), best.Batches)
	return out, nil
}
