package workload

import (
	"fmt"
	"io"
	"math"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
)

// Report is the outcome of a sim run. Times are modeled milliseconds: wall
// time × time scale, so at a time scale other than 1 the engine's real
// overheads inside them are multiplied too (ScaledOverheads says so).
// Bytes are modeled (the model's real KV bytes) unless the name says moved
// (what the emulator copied at --scale).
type Report struct {
	Model      string `json:"model"`
	HookLayers int    `json:"hook_layers"`
	Buffers    int    `json:"buffers"`
	Requests   int    `json:"requests"`
	// Resident is how many requests' pages the pools hold at once.
	Resident     int `json:"resident"`
	PromptTokens int `json:"prompt_tokens"`
	ChunkTokens  int `json:"chunk_tokens"`
	PageSize     int `json:"page_size"`
	GroupSize    int `json:"group_size"`
	// GroupAuto is what --group auto chose and why (nil with a given K).
	GroupAuto     *system.GroupChoice `json:"group_auto,omitempty"`
	LinkGbitPerS  float64             `json:"link_gbit_per_s"`
	LinkLatencyUs float64             `json:"link_latency_us"`
	CPSize        int                 `json:"cp_size"`
	CPRank        int                 `json:"cp_rank"`
	CPRule        string              `json:"cp_rule"`
	// PrefillTP, DecodeTP, PrefillPP and DecodePP are the sharded run's
	// pairing (0 when the run is not sharded); PageOrder both sides' page layout then. A sharded
	// run's batches, blocks and bytes count every prefill rank's.
	PrefillTP     int     `json:"prefill_tp,omitempty"`
	DecodeTP      int     `json:"decode_tp,omitempty"`
	PrefillPP     int     `json:"prefill_pp,omitempty"`
	DecodePP      int     `json:"decode_pp,omitempty"`
	PageOrder     string  `json:"page_order,omitempty"`
	Scale         int     `json:"scale"`
	ItemLen       int     `json:"item_len_bytes_moved"`
	PageBytesReal int     `json:"page_bytes_modeled"`
	TimeScale     float64 `json:"time_scale"`
	// ScaledOverheads is true when the time scale is not 1: every modeled
	// time then holds the engine's and the emulator's real overheads
	// multiplied by the time scale, so exposed times and ratios to the
	// floor do not measure the engine.
	ScaledOverheads bool `json:"scaled_overheads"`
	Forwards        int  `json:"forwards"`

	BytesEqual bool   `json:"bytes_equal"`
	Mismatch   string `json:"mismatch,omitempty"`
	// OracleFailures is what the oracles other than the byte check caught,
	// each prefixed with its mode: a Finish SUCCESS before every batch of
	// its chunk landed, a batch posted into a finished chunk (the
	// transport guard, landguard.go), a request whose exposed time is
	// below the lower bound no sender can beat (lowerBounds). Any entry
	// fails the run (`kvstream sim` exits non-zero).
	OracleFailures []string `json:"oracle_failures,omitempty"`

	// FloorMs is the per-layer run's ideal floor, the mean over requests
	// (see floor.go and docs/PERFORMANCE.md).
	FloorMs float64 `json:"floor_ms"`
	// SubmitsPerForward is the per-layer run's batches per forward;
	// BlocksPerForward its writes per forward.
	SubmitsPerForward float64 `json:"submits_per_forward"`
	BlocksPerForward  float64 `json:"blocks_per_forward"`
	// ExposedGain is monolithic exposed / per-layer exposed (means).
	ExposedGain float64 `json:"exposed_gain"`

	PerLayer   *ModeReport `json:"per_layer"`
	Monolithic *ModeReport `json:"monolithic"`
	Note       string      `json:"note"`
	// Verdict is the run against the project's targets; its line ends
	// the text.
	Verdict *Verdict `json:"verdict"`
}

// ModeReport is one mode's figures.
type ModeReport struct {
	PerLayer bool `json:"-"`
	// TTFTMs is the mean over requests of the time to first token as serving
	// benchmarks define it, from the request's arrival to the return of its
	// last Finish (its KV is then on the decode side). Every request of the
	// batch arrives at the start of the run.
	TTFTMs float64 `json:"ttft_ms"`
	TTFT   Dist    `json:"ttft_dist_ms"`
	// ExposedMs is the mean over requests of the return of the request's
	// last Finish minus the modeled end of its last forward: the transfer
	// time the forward did not hide.
	ExposedMs float64 `json:"exposed_ms"`
	Exposed   Dist    `json:"exposed_dist_ms"`
	// FloorMs is this mode's ideal floor (mean over requests); RatioToFloor
	// is ExposedMs / FloorMs, RatioDist the per-request ratios.
	FloorMs      float64 `json:"floor_ms"`
	RatioToFloor float64 `json:"ratio_to_floor"`
	RatioDist    Dist    `json:"ratio_to_floor_dist"`

	Forwards          int     `json:"forwards"`
	Batches           int     `json:"batches"`
	SubmitsPerForward float64 `json:"submits_per_forward"`
	Blocks            int     `json:"blocks"`
	// BlocksPerForward is the writes (contiguous blocks) posted per forward,
	// all prefill ranks together in a sharded run, like SubmitsPerForward.
	BlocksPerForward float64 `json:"blocks_per_forward"`
	// BytesModeled are the model's KV bytes the batches carried (what the
	// link model charges); BytesMoved what the emulator copied at --scale.
	BytesModeled float64 `json:"bytes_modeled"`
	BytesMoved   uint64  `json:"bytes_moved"`
	// EffectiveGBytePerS is modeled bytes over the modeled window from the
	// first post to the last completion; MovedGBytePerS moved bytes over
	// the same window in wall time (what crossed the transport, per second).
	EffectiveGBytePerS float64 `json:"effective_gbyte_per_s"`
	MovedGBytePerS     float64 `json:"moved_gbyte_per_s"`
	// EventWait is how long submitters waited on events.
	EventWait Dist `json:"event_wait_dist_ms"`
	// BatchPhases split each batch's life: detect (its event completed on
	// the device → the submitter's wait returned), post (→ posted), land
	// (→ the transport reported completion).
	BatchPhases map[string]Dist `json:"batch_phases_ms"`
	// ExposedPhases split each request's exposed time (its last chunk):
	// detect (the forward ended on the device → the chunk's last wait
	// returned), post, land, finish (last landing → Finish returned). Each
	// instant is clamped to the one before; the phases add up to the
	// exposed time.
	ExposedPhases map[string]Dist `json:"exposed_phases_ms"`
	// Finish is Finish call → return.
	Finish Dist `json:"finish_dist_ms"`
	// LinkLag is how late the emulated link landed each batch after its
	// modeled instant (a local decode side only): the emulator's lag,
	// carried by every landing after it and so by the exposed time, which
	// no real link has. Far above zero, the exposed time measures the
	// emulator competing for the processors as much as the engine.
	LinkLag Dist `json:"link_lag_ms"`
	// SharedForwards counts the forwards that held a request's last chunk
	// and another request's chunk; OrderInversions those of them in which
	// another request's batch gated by the forward's end (its hookless
	// buffers) was posted before the finishing request's, which the floor
	// (and send order by deadline) puts first.
	SharedForwards  int             `json:"shared_forwards"`
	OrderInversions int             `json:"order_inversions"`
	WallSeconds     float64         `json:"wall_seconds"`
	PerRequest      []RequestReport `json:"per_request"`
	// Failed counts chunks whose Finish failed; FirstError is the first
	// cause. Aborted says why the run stopped scheduling early.
	// SlotWaits counts the forwards that waited for a request's pages to
	// be released (more requests than --resident, transfers behind).
	SlotWaits int `json:"slot_waits"`
	Failed    int `json:"failed_chunks"`
	// FaultsInjected counts the transport faults Config.Fault injected;
	// WorksResent the Works (a group, or the rest, to one destination)
	// re-sent after their batch broke or its completion was overdue;
	// ChunksResumed the chunks that
	// succeeded after re-sending (every prefill rank's).
	FaultsInjected int `json:"faults_injected"`
	// FaultsPastLimit counts the Works the injector broke (or lost the
	// completion of) more than the resend limit times in a row: each fails its chunk, so Failed is at
	// most this when nothing else failed.
	FaultsPastLimit int    `json:"faults_past_resend_limit"`
	WorksResent     int    `json:"groups_resent"`
	ChunksResumed   int    `json:"chunks_resumed"`
	FirstError      string `json:"first_error,omitempty"`
	Aborted         string `json:"aborted,omitempty"`
	// What the run did, also when it stopped early: forwards launched and
	// ended, chunks whose Finish succeeded (on every prefill rank),
	// requests all of whose chunks did, and requests a drain (Config
	// Drain) kept from starting.
	ForwardsDone int `json:"forwards_done"`
	ChunksDone   int `json:"chunks_done"`
	RequestsDone int `json:"requests_done"`
	NotStarted   int `json:"not_started,omitempty"`

	mismatch string
	oracle   []string // see Report.OracleFailures
	timeline *Timeline
}

// RequestReport is one request's figures.
type RequestReport struct {
	Room      int     `json:"room"`
	ArrivalMs float64 `json:"arrival_ms"`
	TTFTMs    float64 `json:"ttft_ms"`
	ExposedMs float64 `json:"exposed_ms"`
	FloorMs   float64 `json:"floor_ms"`
}

// Dist summarizes samples. A 99th percentile of fewer than 100 samples is
// the maximum under another name, so P99 is only set from 100 samples on;
// Max always is.
type Dist struct {
	N   int      `json:"n"`
	P50 float64  `json:"p50"`
	P99 *float64 `json:"p99,omitempty"`
	Max float64  `json:"max"`
}

// Tail returns the distribution's tail and its name: p99 from 100 samples
// on, max below.
func (d Dist) Tail() (string, float64) {
	if d.P99 != nil {
		return "p99", *d.P99
	}
	return "max", d.Max
}

// Phase names, in order.
var (
	batchPhaseNames   = []string{"detect", "post", "land"}
	exposedPhaseNames = []string{"detect", "post", "land", "finish"}
)

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
	d := Dist{N: len(s), P50: q(0.5), Max: s[len(s)-1]}
	if len(s) >= 100 {
		p99 := q(0.99)
		d.P99 = &p99
	}
	return d
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
	r := &Report{
		Model: cfg.Preset.Name, HookLayers: g.hookLayers, Buffers: g.buffers, Requests: cfg.Requests, Resident: g.resident,
		PromptTokens: cfg.PromptTokens, ChunkTokens: cfg.ChunkTokens, PageSize: cfg.PageSize, GroupSize: cfg.GroupSize,
		LinkGbitPerS: cfg.LinkGbps, LinkLatencyUs: float64(cfg.LinkLatency) / float64(time.Microsecond),
		CPSize: cfg.CP.Size, CPRank: cfg.CP.Rank, CPRule: cfg.CP.Rule.String(),
		Scale: g.scale, ItemLen: g.itemLen, PageBytesReal: g.pageBytes, TimeScale: cfg.TimeScale,
		ScaledOverheads: cfg.TimeScale != 1, Forwards: len(p.forwards),
	}
	if g.sharded {
		r.PrefillTP, r.DecodeTP, r.PageOrder = g.preReal.TP, g.decReal.TP, cfg.PageOrder.String()
		r.PrefillPP, r.DecodePP = g.preReal.PP(), g.decReal.PP()
	}
	return r
}

// summarize turns one mode's observations into figures.
func (m *ModeReport) summarize(cfg Config, g geometry, p *plan, col *collector, t0 time.Time, forwardEnds []time.Time) {
	ms := func(d time.Duration) float64 { return float64(d) * cfg.TimeScale / float64(time.Millisecond) }
	at := func(t time.Time) time.Duration { return time.Duration(float64(t.Sub(t0)) * cfg.TimeScale) }
	col.mu.Lock()
	defer col.mu.Unlock()

	lastForward := make([]int, cfg.Requests)
	for k, fw := range p.forwards {
		for _, pc := range fw {
			lastForward[pc.room] = k
		}
	}
	// The floor on this run's own modeled timeline: the kernels as the
	// virtual GPU ran them.
	floor := floors(cfg, g, p, m.PerLayer, func(k, l int) time.Duration {
		return at(col.kernels[testbed.KernelName(k+1, l)].End)
	})
	if g.sharded {
		floor = shardedFloors(cfg, g, p, m.PerLayer, func(st, r, k, l int) time.Duration {
			return at(col.byStream[rankStream(st, r)][testbed.KernelName(k+1, l)].End)
		})
	}

	// Every request arrives at the start of the run.
	arrival := make([]time.Time, cfg.Requests)
	for r := range arrival {
		arrival[r] = t0
	}
	lastRet := make([]time.Time, cfg.Requests)
	lastFin := make([]*finishRec, cfg.Requests)
	var finishes []float64
	for i := range col.finishes {
		f := &col.finishes[i]
		// A worker may call Finish before the chunk's forward ended (the
		// sim hands a chunk over once its forward is enqueued): the
		// call's latency counts from the later of the two.
		call := f.call
		if f.forward < len(forwardEnds) {
			call = later(call, forwardEnds[f.forward])
		}
		finishes = append(finishes, ms(f.ret.Sub(call)))
		if f.ret.After(lastRet[f.room]) {
			lastRet[f.room] = f.ret
			lastFin[f.room] = f
		}
	}
	// The bound no sender can beat (unsharded runs: a sharded run's
	// floors already give each rank's link to its own batches).
	var bound []float64
	if !g.sharded {
		bound = lowerBounds(cfg, g, p, m.PerLayer, func(k, l int) time.Duration {
			return at(col.kernels[testbed.KernelName(k+1, l)].End)
		})
	}
	var ttft, exposed, floors, ratios []float64
	phases := map[string][]float64{}
	for r := 0; r < cfg.Requests; r++ {
		end := forwardEnds[lastForward[r]]
		rr := RequestReport{Room: r, ArrivalMs: ms(arrival[r].Sub(t0)), TTFTMs: ms(lastRet[r].Sub(arrival[r])),
			ExposedMs: ms(max(lastRet[r].Sub(end), 0)), FloorMs: floor[r]}
		if bound != nil {
			if msg := belowBound(r, rr.ExposedMs, bound[r]); msg != "" {
				m.oracle = append(m.oracle, msg)
			}
		}
		m.PerRequest = append(m.PerRequest, rr)
		ttft = append(ttft, rr.TTFTMs)
		exposed = append(exposed, rr.ExposedMs)
		floors = append(floors, rr.FloorMs)
		if rr.FloorMs > 0 {
			ratios = append(ratios, rr.ExposedMs/rr.FloorMs)
		}
		if f := lastFin[r]; f != nil {
			for i, d := range splitExposed(end, f.stats, f.ret) {
				phases[exposedPhaseNames[i]] = append(phases[exposedPhaseNames[i]], ms(d))
			}
		}
	}
	m.TTFTMs, m.TTFT = mean(ttft), dist(ttft)
	m.ExposedMs, m.Exposed = mean(exposed), dist(exposed)
	m.FloorMs = mean(floors)
	if m.FloorMs > 0 {
		m.RatioToFloor = m.ExposedMs / m.FloorMs
	}
	m.RatioDist = dist(ratios)
	m.Finish = dist(finishes)
	m.ExposedPhases = map[string]Dist{}
	for _, n := range exposedPhaseNames {
		m.ExposedPhases[n] = dist(phases[n])
	}

	window := m.countBatches(col.batches, len(p.forwards))
	var waits []float64
	bphases := map[string][]float64{}
	for _, b := range col.batches {
		waits = append(waits, ms(b.WaitEnd.Sub(b.WaitStart)))
		if b.Err == nil {
			if !b.EventDone.IsZero() {
				bphases["detect"] = append(bphases["detect"], ms(max(b.WaitEnd.Sub(b.EventDone), 0)))
			}
			bphases["post"] = append(bphases["post"], ms(b.Posted.Sub(b.WaitEnd)))
			bphases["land"] = append(bphases["land"], ms(b.Done.Sub(b.Posted)))
		}
	}
	m.BytesModeled = float64(m.BytesMoved) * g.byteScale
	if window > 0 {
		m.EffectiveGBytePerS = m.BytesModeled / (ms(window) / 1e3) / 1e9
	}
	m.EventWait = dist(waits)
	m.BatchPhases = map[string]Dist{}
	for _, n := range batchPhaseNames {
		m.BatchPhases[n] = dist(bphases[n])
	}
	m.SharedForwards, m.OrderInversions = inversions(p, col.batches)
	if cfg.Timeline {
		m.timeline = buildTimeline(cfg, col, t0, forwardEnds)
	}
}

// inversions counts the forwards shared by a finishing request and another
// request, and those in which the other's end-of-forward batch (the
// hookless buffers, messages.Rest; the whole chunk when monolithic) was
// posted before the finishing request's.
func inversions(p *plan, batches []system.Batch) (shared, inverted int) {
	rest := map[[2]int]time.Time{} // (room, chunk start) -> its Rest batch's post
	for _, b := range batches {
		if b.Seq < 0 && b.Err == nil { // messages.Rest
			rest[[2]int{int(b.Chunk.Room), b.Chunk.Start}] = b.Posted
		}
	}
	for _, fw := range p.forwards {
		var fin *piece
		for i := range fw {
			if fw[i].last {
				fin = &fw[i]
				break
			}
		}
		if fin == nil || len(fw) < 2 {
			continue
		}
		at, ok := rest[[2]int{fin.room, fin.start}]
		if !ok {
			continue
		}
		shared++
		for _, pc := range fw {
			if pc.room == fin.room {
				continue
			}
			if other, ok := rest[[2]int{pc.room, pc.start}]; ok && other.Before(at) {
				inverted++
				break
			}
		}
	}
	return shared, inverted
}

// boundSlackMs absorbs the rounding between wall-clock instants and the
// modeled durations the bound adds up (nanoseconds, in float ms).
const boundSlackMs = 0.001

// belowBound names request r if its exposed time is below the lower bound
// no sender can beat: its bytes were counted as landed before they could
// have been.
func belowBound(r int, exposedMs, boundMs float64) string {
	if exposedMs+boundSlackMs >= boundMs {
		return ""
	}
	return fmt.Sprintf("room %d: exposed %.3f ms is below %.3f ms, the least any sender needs for its batches on the modeled link (a completion reported before its landing)",
		r, exposedMs, boundMs)
}

// splitExposed splits the exposed time from end (the forward's end on the
// device) to ret (Finish returned) at the chunk's last wait, last post and
// last landing, each clamped to the one before (system.Phases does the
// same for the metrics).
func splitExposed(end time.Time, s system.ChunkStats, ret time.Time) [4]time.Duration {
	t1 := later(end, s.LastWait)
	t2 := later(t1, s.LastPost)
	t3 := later(t2, s.LastDone)
	t4 := later(t3, ret)
	return [4]time.Duration{t1.Sub(end), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3)}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (r *Report) finish() {
	r.BytesEqual = r.PerLayer.mismatch == "" && r.Monolithic.mismatch == ""
	switch {
	case r.PerLayer.mismatch != "":
		r.Mismatch = "per-layer: " + r.PerLayer.mismatch
	case r.Monolithic.mismatch != "":
		r.Mismatch = "monolithic: " + r.Monolithic.mismatch
	}
	for _, mr := range []*ModeReport{r.PerLayer, r.Monolithic} {
		for _, f := range mr.oracle {
			r.OracleFailures = append(r.OracleFailures, mr.mode()+": "+f)
		}
	}
	r.FloorMs = r.PerLayer.FloorMs
	r.SubmitsPerForward = r.PerLayer.SubmitsPerForward
	r.BlocksPerForward = r.PerLayer.BlocksPerForward
	if r.PerLayer.ExposedMs > 0 {
		r.ExposedGain = r.Monolithic.ExposedMs / r.PerLayer.ExposedMs
	}
	r.Note = "times are modeled ms (wall time x time scale 1: engine and emulator overheads count at their real cost)"
	if r.ScaledOverheads {
		r.Note = fmt.Sprintf("--time-scale %g: modeled time ran %gx faster than wall time, so every real overhead (wake-up, posting, "+
			"the emulator's copies) counts %gx in the modeled times; exposed times and ratios to the floor do not measure the engine, "+
			"run with --time-scale 1 for those", r.TimeScale, r.TimeScale, r.TimeScale)
	}
}

// cell formats a distribution's p50 or tail with its sample count.
func p50Cell(d Dist, format string) string {
	return fmt.Sprintf(format+" (n=%d)", d.P50, d.N)
}

func tailCell(d Dist, format string) string {
	name, v := d.Tail()
	return fmt.Sprintf(format+" (%s of %d)", v, name, d.N)
}

// Text writes the report for people.
func (r *Report) Text(w io.Writer) {
	fmt.Fprintf(w, "kvstream sim: %s, %d hook layers over %d buffers, %d requests x %d tokens (%d resident at once), chunks of %d tokens (%d forwards)\n",
		r.Model, r.HookLayers, r.Buffers, r.Requests, r.PromptTokens, r.Resident, r.ChunkTokens, r.Forwards)
	fmt.Fprintf(w, "page %d tokens (%d B modeled, %d B moved at scale %d), group %d layers, link %g Gb/s + %g us, CP %d/%d %s\n",
		r.PageSize, r.PageBytesReal, r.ItemLen, r.Scale, r.GroupSize, r.LinkGbitPerS, r.LinkLatencyUs, r.CPRank, r.CPSize, r.CPRule)
	if r.GroupAuto != nil {
		fmt.Fprintf(w, "group auto: %s\n", r.GroupAuto.Reason)
	}
	if r.PrefillTP > 0 {
		fmt.Fprintf(w, "sharded: prefill TP %d x PP %d (one engine, stream and %g Gb/s link per rank) -> decode TP %d x PP %d (one pool per rank), %s pages; "+
			"byte scale %d divides the head dim, write counts are real\n", r.PrefillTP, r.PrefillPP, r.LinkGbitPerS, r.DecodeTP, r.DecodePP, r.PageOrder, r.Scale)
	}
	if r.ScaledOverheads {
		fmt.Fprintf(w, "WARNING: ")
	}
	fmt.Fprintf(w, "%s\n\n", r.Note)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tper-layer\tmonolithic\t")
	row := func(name, format string, a, b float64) {
		fmt.Fprintf(tw, "%s\t"+format+"\t"+format+"\t\n", name, a, b)
	}
	dists := func(name, format string, a, b Dist) {
		fmt.Fprintf(tw, "%s p50\t%s\t%s\t\n", name, p50Cell(a, format), p50Cell(b, format))
		fmt.Fprintf(tw, "%s tail\t%s\t%s\t\n", name, tailCell(a, format), tailCell(b, format))
	}
	pl, mo := r.PerLayer, r.Monolithic
	row("TTFT mean (ms)", "%.1f", pl.TTFTMs, mo.TTFTMs)
	dists("TTFT (ms)", "%.1f", pl.TTFT, mo.TTFT)
	row("exposed transfer mean (ms)", "%.3f", pl.ExposedMs, mo.ExposedMs)
	dists("exposed transfer (ms)", "%.3f", pl.Exposed, mo.Exposed)
	row("ideal floor mean (ms)", "%.3f", pl.FloorMs, mo.FloorMs)
	row("exposed / floor (means)", "%.2f", pl.RatioToFloor, mo.RatioToFloor)
	dists("exposed / floor per request", "%.2f", pl.RatioDist, mo.RatioDist)
	for _, n := range exposedPhaseNames {
		dists("  exposed phase "+n+" (ms)", "%.3f", pl.ExposedPhases[n], mo.ExposedPhases[n])
	}
	if pl.SharedForwards > 0 || mo.SharedForwards > 0 {
		row("forwards shared with a finishing request", "%.0f", float64(pl.SharedForwards), float64(mo.SharedForwards))
		row("  another request's end batch posted first", "%.0f", float64(pl.OrderInversions), float64(mo.OrderInversions))
	}
	row("batches per forward", "%.1f", pl.SubmitsPerForward, mo.SubmitsPerForward)
	row("writes (blocks) per forward", "%.0f", pl.BlocksPerForward, mo.BlocksPerForward)
	row("bytes modeled (GB)", "%.2f", pl.BytesModeled/1e9, mo.BytesModeled/1e9)
	row("bytes moved at --scale (GB)", "%.3f", float64(pl.BytesMoved)/1e9, float64(mo.BytesMoved)/1e9)
	row("effective GB/s (modeled bytes)", "%.1f", pl.EffectiveGBytePerS, mo.EffectiveGBytePerS)
	dists("event wait (ms)", "%.3f", pl.EventWait, mo.EventWait)
	for _, n := range batchPhaseNames {
		dists("  batch phase "+n+" (ms)", "%.3f", pl.BatchPhases[n], mo.BatchPhases[n])
	}
	dists("finish call->return (ms)", "%.3f", pl.Finish, mo.Finish)
	dists("emulated link's lag, landed - modeled (ms)", "%.3f", pl.LinkLag, mo.LinkLag)
	row("forwards that waited for a slot", "%.0f", float64(pl.SlotWaits), float64(mo.SlotWaits))
	if pl.FaultsInjected > 0 || mo.FaultsInjected > 0 || pl.WorksResent > 0 || mo.WorksResent > 0 {
		row("transport faults injected (--fault)", "%.0f", float64(pl.FaultsInjected), float64(mo.FaultsInjected))
		row("  groups re-sent after a broken or overdue batch", "%.0f", float64(pl.WorksResent), float64(mo.WorksResent))
		row("  chunks resumed", "%.0f", float64(pl.ChunksResumed), float64(mo.ChunksResumed))
		row("  chunks failed", "%.0f", float64(pl.Failed), float64(mo.Failed))
	}
	row("wall time (s)", "%.1f", pl.WallSeconds, mo.WallSeconds)
	tw.Flush()
	fmt.Fprintf(w, "\nideal floor: an overhead-free sender on the run's own timeline (each batch on the link when its gating kernel ends, in order, at %g Gb/s + %g us)\n",
		r.LinkGbitPerS, r.LinkLatencyUs)
	fmt.Fprintf(w, "exposed transfer: monolithic / per-layer = %.1fx\n", r.ExposedGain)
	fmt.Fprintf(w, "\nper request (ms; every request arrives at 0, TTFT = arrival -> its last Finish returned)\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "room\tTTFT per-layer\tTTFT monolithic\texposed per-layer\tfloor per-layer\texposed monolithic\tfloor monolithic\t")
	for i, a := range pl.PerRequest {
		b := mo.PerRequest[i]
		fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.3f\t%.3f\t%.3f\t%.3f\t\n", a.Room, a.TTFTMs, b.TTFTMs, a.ExposedMs, a.FloorMs, b.ExposedMs, b.FloorMs)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nbytes_equal: %v (checked at each Finish SUCCESS, when a request's pages are released and at the end)\n", r.BytesEqual)
	if r.Mismatch != "" {
		fmt.Fprintf(w, "mismatch: %s\n", r.Mismatch)
	}
	for _, f := range r.OracleFailures {
		fmt.Fprintf(w, "oracle: %s\n", f)
	}
	if r.Verdict != nil {
		fmt.Fprintln(w, r.Verdict)
	}
}
