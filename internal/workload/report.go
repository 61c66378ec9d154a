package workload

import (
	"fmt"
	"io"
	"math"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/messages"
)

// Report is the outcome of a sim run. Times are modeled milliseconds (wall
// time × time scale) unless the name says real; engine overheads (wake-up)
// are real.
type Report struct {
	Model         string  `json:"model"`
	HookLayers    int     `json:"hook_layers"`
	Buffers       int     `json:"buffers"`
	Requests      int     `json:"requests"`
	PromptTokens  int     `json:"prompt_tokens"`
	ChunkTokens   int     `json:"chunk_tokens"`
	PageSize      int     `json:"page_size"`
	GroupSize     int     `json:"group_size"`
	LinkGbps      float64 `json:"link_gbps"`
	CPSize        int     `json:"cp_size"`
	CPRank        int     `json:"cp_rank"`
	CPRule        string  `json:"cp_rule"`
	Scale         int     `json:"scale"`
	ItemLen       int     `json:"item_len_bytes"`
	PageBytesReal int     `json:"page_bytes_real"`
	TimeScale     float64 `json:"time_scale"`
	Forwards      int     `json:"forwards"`

	BytesEqual bool   `json:"bytes_equal"`
	Mismatch   string `json:"mismatch,omitempty"`

	// FloorMs is the mean over requests of the time to send the last group
	// and the hookless buffers of every chunk in the request's last forward,
	// at the modeled link rate.
	FloorMs float64 `json:"floor_ms"`
	// SubmitsPerForward is the per-layer run's batches per forward.
	SubmitsPerForward float64 `json:"submits_per_forward"`
	// ExposedGain is monolithic exposed / per-layer exposed (means).
	ExposedGain float64 `json:"exposed_gain"`

	PerLayer   *ModeReport `json:"per_layer"`
	Monolithic *ModeReport `json:"monolithic"`
	Note       string      `json:"note"`
}

// ModeReport is one mode's figures.
type ModeReport struct {
	PerLayer bool `json:"-"`
	// TTFTMs is the mean over requests of the time from the start of the run
	// to the return of the request's last Finish.
	TTFTMs float64 `json:"ttft_ms"`
	TTFT   Dist    `json:"ttft"`
	// ExposedMs is the mean over requests of finish return minus the end of
	// the request's last forward on the GPU: the transfer time the forward
	// did not hide.
	ExposedMs    float64 `json:"exposed_ms"`
	Exposed      Dist    `json:"exposed"`
	RatioToFloor float64 `json:"ratio_to_floor"`

	Forwards          int     `json:"forwards"`
	Batches           int     `json:"batches"`
	SubmitsPerForward float64 `json:"submits_per_forward"`
	Blocks            int     `json:"blocks"`
	Bytes             float64 `json:"bytes"`        // modeled (real) bytes
	BytesInMemory     uint64  `json:"bytes_copied"` // what was copied at --scale
	EffectiveGBps     float64 `json:"effective_gbps"`
	// EventWait is how long submitters waited on events (modeled ms);
	// WakeUs is the real delay from the event's kernel finishing to the
	// submitter holding the completed wait.
	EventWait Dist `json:"event_wait_ms"`
	WakeUs    Dist `json:"wake_us"`
	// Finish is Finish call → return (modeled ms).
	Finish      Dist            `json:"finish_ms"`
	WallSeconds float64         `json:"wall_seconds"`
	PerRequest  []RequestReport `json:"per_request"`
	// Failed counts chunks whose Finish failed; FirstError is the first
	// cause. Aborted says why the run stopped scheduling early.
	Failed     int    `json:"failed_chunks"`
	FirstError string `json:"first_error,omitempty"`
	Aborted    string `json:"aborted,omitempty"`

	mismatch string
	timeline *Timeline
}

// RequestReport is one request's figures.
type RequestReport struct {
	Room      int     `json:"room"`
	TTFTMs    float64 `json:"ttft_ms"`
	ExposedMs float64 `json:"exposed_ms"`
	FloorMs   float64 `json:"floor_ms"`
}

// Dist summarizes samples.
type Dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func (m *ModeReport) mode() string {
	if m.PerLayer {
		return "per-layer"
	}
	return "monolithic"
}

func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	q := func(p float64) float64 { return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)] }
	return Dist{N: len(s), P50: q(0.5), P99: q(0.99), Max: s[len(s)-1]}
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

func newReport(cfg Config, g geometry, p *plan) *Report {
	return &Report{
		Model: cfg.Preset.Name, HookLayers: g.hookLayers, Buffers: g.buffers, Requests: cfg.Requests,
		PromptTokens: cfg.PromptTokens, ChunkTokens: cfg.ChunkTokens, PageSize: cfg.PageSize, GroupSize: cfg.GroupSize,
		LinkGbps: cfg.LinkGbps, CPSize: cfg.CP.Size, CPRank: cfg.CP.Rank, CPRule: cfg.CP.Rule.String(),
		Scale: g.scale, ItemLen: g.itemLen, PageBytesReal: g.pageBytes, TimeScale: cfg.TimeScale, Forwards: len(p.forwards),
	}
}

// summarize turns one mode's observations into figures.
func (m *ModeReport) summarize(cfg Config, g geometry, p *plan, col *collector, t0 time.Time, forwardEnds []time.Time) {
	ms := func(d time.Duration) float64 { return float64(d) * cfg.TimeScale / float64(time.Millisecond) }
	col.mu.Lock()
	defer col.mu.Unlock()

	// The forward of each request's last chunk, and the floor of that
	// forward: its chunks' last groups plus hookless buffers on the link.
	lastForward := make([]int, cfg.Requests)
	floor := make([]float64, len(p.forwards))
	lastGroupBufs := lastGroupBuffers(cfg, g)
	bw := cfg.LinkGbps * 1e9 / 8
	for k, fw := range p.forwards {
		var bytes float64
		for _, pc := range fw {
			lastForward[pc.room] = k
			bytes += float64(pc.owned) * float64(g.pageBytes) * float64(lastGroupBufs)
		}
		floor[k] = bytes/bw*1e3 + float64(cfg.LinkLatency)/float64(time.Millisecond)
	}

	lastRet := make([]time.Time, cfg.Requests)
	var finishes []float64
	for _, f := range col.finishes {
		finishes = append(finishes, ms(f.ret.Sub(f.call)))
		if f.ret.After(lastRet[f.room]) {
			lastRet[f.room] = f.ret
		}
	}
	var ttft, exposed, floors []float64
	for r := 0; r < cfg.Requests; r++ {
		rr := RequestReport{Room: r, TTFTMs: ms(lastRet[r].Sub(t0)), ExposedMs: ms(lastRet[r].Sub(forwardEnds[lastForward[r]])), FloorMs: floor[lastForward[r]]}
		m.PerRequest = append(m.PerRequest, rr)
		ttft = append(ttft, rr.TTFTMs)
		exposed = append(exposed, rr.ExposedMs)
		floors = append(floors, rr.FloorMs)
	}
	m.TTFTMs, m.TTFT = mean(ttft), dist(ttft)
	m.ExposedMs, m.Exposed = mean(exposed), dist(exposed)
	if f := mean(floors); f > 0 {
		m.RatioToFloor = m.ExposedMs / f
	}
	m.Finish = dist(finishes)

	forwardOf := map[[2]int]int{}
	for k, fw := range p.forwards {
		for _, pc := range fw {
			forwardOf[[2]int{pc.room, pc.start}] = k
		}
	}
	var waits, wakes []float64
	var first, last time.Time
	for _, b := range col.batches {
		m.Batches++
		m.Blocks += b.Blocks
		m.BytesInMemory += b.Bytes
		waits = append(waits, ms(b.WaitEnd.Sub(b.WaitStart)))
		if k, ok := gatingKernel(cfg, g, forwardOf, b); ok {
			if s, ok := col.kernels[k]; ok {
				wakes = append(wakes, float64(b.WaitEnd.Sub(s.Ran))/float64(time.Microsecond))
			}
		}
		if first.IsZero() || b.Posted.Before(first) {
			first = b.Posted
		}
		if b.Done.After(last) {
			last = b.Done
		}
	}
	m.Bytes = float64(m.BytesInMemory) * g.byteScale
	if window := ms(last.Sub(first)); window > 0 {
		m.EffectiveGBps = m.Bytes / (window / 1e3) / 1e9
	}
	m.EventWait, m.WakeUs = dist(waits), dist(wakes)
	m.SubmitsPerForward = float64(m.Batches) / float64(len(p.forwards))
	if cfg.Timeline {
		m.timeline = buildTimeline(cfg, col, t0, forwardEnds)
	}
}

// lastGroupBuffers counts the buffers sent after the last boundary: the
// last group's and the hookless ones.
func lastGroupBuffers(cfg Config, g geometry) int {
	lastGroup := (g.hookLayers - 1) / cfg.GroupSize
	layers := g.hookLayers - lastGroup*cfg.GroupSize + cfg.Preset.ExtraLayers
	if !cfg.Preset.MLA {
		return 2 * layers
	}
	return layers
}

// gatingKernel names the kernel whose completion a batch's event marks.
func gatingKernel(cfg Config, g geometry, forwardOf map[[2]int]int, b actors.Batch) (string, bool) {
	k, ok := forwardOf[[2]int{int(b.Chunk.Room), b.Chunk.Start}]
	if !ok {
		return "", false
	}
	layer := g.layers - 1 // the end event follows the last kernel
	if b.Seq != messages.Rest {
		layer = min((b.Seq+1)*cfg.GroupSize, g.hookLayers) - 1
	}
	return testbed.KernelName(k+1, layer), true
}

func (r *Report) finish() {
	r.BytesEqual = r.PerLayer.mismatch == "" && r.Monolithic.mismatch == ""
	switch {
	case r.PerLayer.mismatch != "":
		r.Mismatch = "per-layer: " + r.PerLayer.mismatch
	case r.Monolithic.mismatch != "":
		r.Mismatch = "monolithic: " + r.Monolithic.mismatch
	}
	var floors []float64
	for _, rr := range r.PerLayer.PerRequest {
		floors = append(floors, rr.FloorMs)
	}
	r.FloorMs = mean(floors)
	r.SubmitsPerForward = r.PerLayer.SubmitsPerForward
	if r.PerLayer.ExposedMs > 0 {
		r.ExposedGain = r.Monolithic.ExposedMs / r.PerLayer.ExposedMs
	}
	r.Note = "times are modeled (wall time x time scale); wake_us is real engine overhead"
	if r.TimeScale != 1 {
		r.Note = fmt.Sprintf("modeled time ran %gx faster than wall time: times are modeled (wall x %g); wake_us is real engine overhead", r.TimeScale, r.TimeScale)
	}
}

// Text writes the report for people.
func (r *Report) Text(w io.Writer) {
	fmt.Fprintf(w, "kvstream sim: %s, %d hook layers over %d buffers, %d requests x %d tokens, chunks of %d tokens (%d forwards)\n",
		r.Model, r.HookLayers, r.Buffers, r.Requests, r.PromptTokens, r.ChunkTokens, r.Forwards)
	fmt.Fprintf(w, "page %d tokens (%d B real, %d B in memory at scale %d), group %d layers, link %g Gb/s, CP %d/%d %s\n",
		r.PageSize, r.PageBytesReal, r.ItemLen, r.Scale, r.GroupSize, r.LinkGbps, r.CPRank, r.CPSize, r.CPRule)
	fmt.Fprintf(w, "%s\n\n", r.Note)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tper-layer\tmonolithic\t")
	row := func(name, format string, a, b float64) {
		fmt.Fprintf(tw, "%s\t"+format+"\t"+format+"\t\n", name, a, b)
	}
	pl, mo := r.PerLayer, r.Monolithic
	row("TTFT mean (ms)", "%.1f", pl.TTFTMs, mo.TTFTMs)
	row("TTFT p99 (ms)", "%.1f", pl.TTFT.P99, mo.TTFT.P99)
	row("exposed transfer mean (ms)", "%.2f", pl.ExposedMs, mo.ExposedMs)
	row("exposed transfer p99 (ms)", "%.2f", pl.Exposed.P99, mo.Exposed.P99)
	row("exposed / floor", "%.2f", pl.RatioToFloor, mo.RatioToFloor)
	row("batches per forward", "%.1f", pl.SubmitsPerForward, mo.SubmitsPerForward)
	row("bytes (GB, real)", "%.2f", pl.Bytes/1e9, mo.Bytes/1e9)
	row("effective GB/s", "%.1f", pl.EffectiveGBps, mo.EffectiveGBps)
	row("event wait p50 (ms)", "%.2f", pl.EventWait.P50, mo.EventWait.P50)
	row("event wait p99 (ms)", "%.2f", pl.EventWait.P99, mo.EventWait.P99)
	row("wake-up p50 (us, real)", "%.0f", pl.WakeUs.P50, mo.WakeUs.P50)
	row("wake-up p99 (us, real)", "%.0f", pl.WakeUs.P99, mo.WakeUs.P99)
	row("finish p50 (ms)", "%.2f", pl.Finish.P50, mo.Finish.P50)
	row("finish p99 (ms)", "%.2f", pl.Finish.P99, mo.Finish.P99)
	row("wall time (s)", "%.1f", pl.WallSeconds, mo.WallSeconds)
	tw.Flush()
	fmt.Fprintf(w, "\nfloor (last group + hookless buffers of the last forward, at the link rate): %.2f ms\n", r.FloorMs)
	fmt.Fprintf(w, "exposed transfer: monolithic / per-layer = %.1fx\n", r.ExposedGain)
	fmt.Fprintf(w, "\nper request (ms)\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "room\tTTFT per-layer\tTTFT monolithic\texposed per-layer\texposed monolithic\tfloor\t")
	for i, a := range pl.PerRequest {
		b := mo.PerRequest[i]
		fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t\n", a.Room, a.TTFTMs, b.TTFTMs, a.ExposedMs, b.ExposedMs, a.FloorMs)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nbytes_equal: %v\n", r.BytesEqual)
	if r.Mismatch != "" {
		fmt.Fprintf(w, "mismatch: %s\n", r.Mismatch)
	}
}
