package workload

import (
	"fmt"
	"strings"
	"time"
)

// The project's targets for a sim run (docs/PERFORMANCE.md): each mode's
// mean exposed transfer within this many times its own ideal floor.
const (
	PerLayerTarget   = 1.5
	MonolithicTarget = 1.25
)

// Verdict is a run against the project's targets: each mode's exposed
// transfer over its floor against its target, whether every byte was
// equal, and whether the machine took the CPU from the run while it ran,
// which makes every exposed time, so every ratio, higher than the engine
// alone would. String is its one line.
type Verdict struct {
	PerLayer   TargetCheck `json:"per_layer"`
	Monolithic TargetCheck `json:"monolithic"`
	BytesEqual bool        `json:"bytes_equal"`
	// StalledMs is how long in total this process could not run while
	// the two runs went on, as lab/stallprobe measures it: the late wakes
	// of a goroutine that wakes every millisecond, each more than 2 ms
	// late (another process or the hypervisor had the CPU). Loaded says
	// there was any; Note says what it means then.
	StalledMs float64 `json:"stalled_ms"`
	Loaded    bool    `json:"loaded"`
	// ScaledOverheads: at a time scale other than 1 the ratios do not
	// measure the engine (Report.ScaledOverheads).
	ScaledOverheads bool   `json:"scaled_overheads,omitempty"`
	Note            string `json:"note,omitempty"`
}

// TargetCheck is one mode's exposed transfer over its floor (means over
// requests, ModeReport.RatioToFloor) against its target.
type TargetCheck struct {
	Ratio  float64 `json:"ratio_to_floor"`
	Target float64 `json:"target"`
	OK     bool    `json:"ok"`
}

func check(ratio, target float64) TargetCheck {
	return TargetCheck{Ratio: ratio, Target: target, OK: ratio <= target}
}

// newVerdict judges r, whose runs this process could not run for stalled
// in total.
func newVerdict(r *Report, stalled time.Duration) *Verdict {
	v := &Verdict{
		PerLayer:   check(r.PerLayer.RatioToFloor, PerLayerTarget),
		Monolithic: check(r.Monolithic.RatioToFloor, MonolithicTarget),
		BytesEqual: r.BytesEqual, StalledMs: float64(stalled) / float64(time.Millisecond),
		Loaded: stalled > 0, ScaledOverheads: r.ScaledOverheads,
	}
	if v.Loaded {
		ms := fmt.Sprintf("%.1f", v.StalledMs)
		if v.StalledMs >= 10 {
			ms = fmt.Sprintf("%.0f", v.StalledMs)
		}
		v.Note = "the machine was loaded: this process could not run for " + ms + " ms in total (stall probe); figures may be high"
	}
	return v
}

func (c TargetCheck) word() string {
	if c.OK {
		return "ok"
	}
	return "over target"
}

// String is the verdict's line: "verdict: per-layer 1.23× floor (target ≤
// 1.5) ok, monolithic 1.04× (≤ 1.25) ok, bytes equal: true", and what
// makes the figures doubtful, if anything.
func (v Verdict) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "verdict: per-layer %.2f× floor (target ≤ %g) %s, monolithic %.2f× (≤ %g) %s, bytes equal: %v",
		v.PerLayer.Ratio, v.PerLayer.Target, v.PerLayer.word(), v.Monolithic.Ratio, v.Monolithic.Target, v.Monolithic.word(), v.BytesEqual)
	if v.ScaledOverheads {
		b.WriteString("; the time scale is not 1: the ratios do not measure the engine")
	}
	if v.Note != "" {
		b.WriteString("; " + v.Note)
	}
	return b.String()
}
