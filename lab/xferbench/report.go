package xferbench

import (
	"fmt"
	"sort"
	"strings"
)

// Report is a benchmark's result; its JSON is what `kvstream bench
// transport --json` prints.
type Report struct {
	Transport      string `json:"transport"`
	UCXTLS         string `json:"ucx_tls,omitempty"` // UCX_TLS as UCX reads it ("all" when unset)
	Size           uint64 `json:"size"`
	Count          int    `json:"count"`
	Window         int    `json:"window"`
	WritesPerBatch int    `json:"writes_per_batch"`
	Slots          int    `json:"slots"`
	Pool           string `json:"pool"` // "allocated" (by the transports) or "registered" (hostmem)
	Warmup         int    `json:"warmup"`
	// WarmupRuns untimed runs of Warmup writes took WarmupSeconds.
	WarmupRuns    int     `json:"warmup_runs"`
	WarmupSeconds float64 `json:"warmup_seconds"`
	Repeat        int     `json:"repeat"`
	CPUs          int     `json:"cpus"`
	Bytes         uint64  `json:"bytes"` // per run: count × size
	// Seconds is the median run's; BytesPerSecond is Bytes over it.
	Seconds           float64 `json:"seconds"`
	BytesPerSecond    float64 `json:"bytes_per_second"`
	BytesPerSecondMin float64 `json:"bytes_per_second_min"`
	BytesPerSecondMax float64 `json:"bytes_per_second_max"`
	// VerifiedBytes are the distinct destination bytes compared with the
	// source after every run: min(count, slots) × size.
	VerifiedBytes uint64 `json:"verified_bytes"`

	MemcpySeconds           float64 `json:"memcpy_seconds,omitempty"`
	MemcpyBytesPerSecond    float64 `json:"memcpy_bytes_per_second,omitempty"`
	MemcpyBytesPerSecondMin float64 `json:"memcpy_bytes_per_second_min,omitempty"`
	MemcpyBytesPerSecondMax float64 `json:"memcpy_bytes_per_second_max,omitempty"`
	// RatioToMemcpy is the median over runs of transport / memcpy bandwidth
	// of the same run: pairing the runs cancels slow drifts of a noisy
	// machine better than a ratio of medians.
	RatioToMemcpy float64 `json:"ratio_to_memcpy,omitempty"`

	// Perftest has one entry per PerftestBuffers kind under --perftest.
	Perftest []PerftestReport `json:"perftest,omitempty"`

	Runs []RunResult `json:"runs"`
}

// PerftestReport is ucx_perftest ucp_put_bw beside the transport's runs,
// with one kind of buffers.
type PerftestReport struct {
	Buffers   string `json:"buffers"`              // "default" or "mmap,heap"
	AllocPrio string `json:"alloc_prio,omitempty"` // UCX_ALLOC_PRIO it ran with
	// BytesPerSecond is the median run's (its overall message rate times
	// the size).
	BytesPerSecond    float64 `json:"bytes_per_second"`
	BytesPerSecondMin float64 `json:"bytes_per_second_min"`
	BytesPerSecondMax float64 `json:"bytes_per_second_max"`
	// Ratio is the median over rounds of the transport's bandwidth over
	// ucx_perftest's in the same round (RatioToMemcpy says why paired).
	Ratio    float64 `json:"ratio"`
	RatioMin float64 `json:"ratio_min"`
	RatioMax float64 `json:"ratio_max"`
}

// RunResult is one timed run (and its memcpy twin).
type RunResult struct {
	Seconds              float64 `json:"seconds"`
	BytesPerSecond       float64 `json:"bytes_per_second"`
	MemcpySeconds        float64 `json:"memcpy_seconds,omitempty"`
	MemcpyBytesPerSecond float64 `json:"memcpy_bytes_per_second,omitempty"`
	// PerftestBytesPerSecond: ucx_perftest's runs after this one, in
	// PerftestBuffers order.
	PerftestBytesPerSecond []float64 `json:"perftest_bytes_per_second,omitempty"`
}

// Line is the report as one readable line.
func (r *Report) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", r.Transport)
	if r.UCXTLS != "" {
		fmt.Fprintf(&b, " (UCX_TLS=%s)", r.UCXTLS)
	}
	batch := "write"
	if r.WritesPerBatch > 1 {
		batch = "writes"
	}
	fmt.Fprintf(&b, ": %d × %s puts, window %d × %d %s, %s pools: %s in %.3f s", r.Count, FormatBytes(r.Size), r.Window,
		r.WritesPerBatch, batch, r.Pool, formatRate(r.BytesPerSecond), r.Seconds)
	if r.Repeat > 1 {
		fmt.Fprintf(&b, " (median of %d, %s–%s)", r.Repeat, formatGBs(r.BytesPerSecondMin), formatGBs(r.BytesPerSecondMax))
	}
	if r.MemcpyBytesPerSecond > 0 {
		fmt.Fprintf(&b, "; memcpy %s", formatRate(r.MemcpyBytesPerSecond))
		if r.Repeat > 1 {
			fmt.Fprintf(&b, " (%s–%s)", formatGBs(r.MemcpyBytesPerSecondMin), formatGBs(r.MemcpyBytesPerSecondMax))
		}
		fmt.Fprintf(&b, "; ratio %.2f", r.RatioToMemcpy)
	}
	for _, p := range r.Perftest {
		fmt.Fprintf(&b, "; ucx_perftest (%s buffers) %s", p.Buffers, formatRate(p.BytesPerSecond))
		if r.Repeat > 1 {
			fmt.Fprintf(&b, " (%s–%s)", formatGBs(p.BytesPerSecondMin), formatGBs(p.BytesPerSecondMax))
		}
		fmt.Fprintf(&b, "; ratio %.2f", p.Ratio)
		if r.Repeat > 1 {
			fmt.Fprintf(&b, " (%.2f–%.2f)", p.RatioMin, p.RatioMax)
		}
	}
	fmt.Fprintf(&b, "; %s verified", FormatBytes(r.VerifiedBytes))
	return b.String()
}

// summarize fills the medians and ranges from the runs, the memcpy and
// ucx_perftest ones too when there are.
func (r *Report) summarize(memcpy, perftest bool) {
	pick := func(f func(RunResult) float64) []float64 {
		v := make([]float64, len(r.Runs))
		for i, run := range r.Runs {
			v[i] = f(run)
		}
		sort.Float64s(v)
		return v
	}
	if perftest {
		for k, kind := range PerftestBuffers {
			bps := pick(func(x RunResult) float64 { return x.PerftestBytesPerSecond[k] })
			ratio := pick(func(x RunResult) float64 { return x.BytesPerSecond / x.PerftestBytesPerSecond[k] })
			r.Perftest = append(r.Perftest, PerftestReport{
				Buffers: kind.Name, AllocPrio: kind.AllocPrio,
				BytesPerSecond: median(bps), BytesPerSecondMin: bps[0], BytesPerSecondMax: bps[len(bps)-1],
				Ratio: median(ratio), RatioMin: ratio[0], RatioMax: ratio[len(ratio)-1],
			})
		}
	}
	secs := pick(func(x RunResult) float64 { return x.Seconds })
	r.Seconds = median(secs)
	r.BytesPerSecond = float64(r.Bytes) / r.Seconds
	r.BytesPerSecondMin, r.BytesPerSecondMax = float64(r.Bytes)/secs[len(secs)-1], float64(r.Bytes)/secs[0]
	if !memcpy {
		return
	}
	msecs := pick(func(x RunResult) float64 { return x.MemcpySeconds })
	r.MemcpySeconds = median(msecs)
	r.MemcpyBytesPerSecond = float64(r.Bytes) / r.MemcpySeconds
	r.MemcpyBytesPerSecondMin, r.MemcpyBytesPerSecondMax = float64(r.Bytes)/msecs[len(msecs)-1], float64(r.Bytes)/msecs[0]
	r.RatioToMemcpy = median(pick(func(x RunResult) float64 { return x.BytesPerSecond / x.MemcpyBytesPerSecond }))
}

// median of sorted values.
func median(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// formatRate prints a bandwidth in GB/s and, for comparison with
// ucx_perftest (whose "MB/s" are 2^20 bytes per second), in MiB/s.
func formatRate(bps float64) string {
	return fmt.Sprintf("%s (%.0f MiB/s)", formatGBs(bps), bps/(1<<20))
}

func formatGBs(bps float64) string { return fmt.Sprintf("%.2f GB/s", bps/1e9) }
