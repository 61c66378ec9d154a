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
	// means 1): a simulation keeps pages smaller than the model's.
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

// ChooseGroup picks K for buffers (hook layers 0..hookLayers-1, the rest
// hookless) under m: the smallest K within the batch bound whose last group
// lands before the forward ends (it hides under the hookless layers, and a
// small K leaves the least to send after its group's layer); if none does,
// the K of least modeled exposed time (the fewer batches on a tie).
func ChooseGroup(m GroupModel, buffers []Buffer, hookLayers int) (GroupChoice, error) {
	switch {
	case hookLayers < 1:
		return GroupChoice{}, badInput("auto group: hook layers %d: must be at least 1", hookLayers)
	case m.LinkBytesPerSec <= 0 || math.IsNaN(m.LinkBytesPerSec) || math.IsInf(m.LinkBytesPerSec, 0):
		return GroupChoice{}, badInput("auto group: link rate %v bytes/s: must be positive", m.LinkBytesPerSec)
	case m.PagesPerForward < 1:
		return GroupChoice{}, badInput("auto group: pages per forward %d: must be at least 1", m.PagesPerForward)
	case m.LayerTime < 0 || m.Latency < 0 || m.BatchOverhead < 0 || m.MaxBatches < 0 || m.ItemScale < 0:
		return GroupChoice{}, badInput("auto group: negative layer time, latency, overhead, batch bound or item scale in %+v", m)
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
