package system

import (
	"reflect"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/internal/stderrs"
	"github.com/kvstream/kvstream/messages"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, for dashboards, alerts and tools that read a registry (see
// docs/OBSERVABILITY.md for types, labels and meaning).
const (
	MetricPostedBytes          = "kvstream_posted_bytes_total"
	MetricPostedBlocks         = "kvstream_posted_blocks_total"
	MetricBatches              = "kvstream_batches_total"
	MetricEventWait            = "kvstream_event_wait_seconds"
	MetricBatchSeconds         = "kvstream_batch_seconds"
	MetricChunkTransfer        = "kvstream_chunk_transfer_seconds"
	MetricFinishSeconds        = "kvstream_finish_seconds"
	MetricExposedTransfer      = "kvstream_exposed_transfer_seconds"
	MetricExposedPhase         = "kvstream_exposed_phase_seconds"
	MetricBatchPhase           = "kvstream_batch_phase_seconds"
	MetricRegistrations        = "kvstream_registrations_total"
	MetricRegistrationsRefused = "kvstream_registrations_refused_total"
	MetricChunks               = "kvstream_chunks_total"
	MetricTimeouts             = "kvstream_timeouts_total"
	MetricGroupsResent         = "kvstream_groups_resent_total"
	MetricChunksResumed        = "kvstream_chunks_resumed_total"
	MetricBatchesOverdue       = "kvstream_batches_overdue_total"
	MetricSubmitterRestarts    = "kvstream_submitter_restarts_total"
	MetricActiveContexts       = "kvstream_active_contexts"
	MetricRoomsInFlight        = "kvstream_rooms_in_flight"
	MetricBytesInFlight        = "kvstream_bytes_in_flight"
	MetricSubmitQueueDepth     = "kvstream_submit_queue_depth"
	MetricHealthy              = "kvstream_healthy"
)

// DurationBuckets are the bounds (seconds) of every kvstream latency
// histogram: 1-2.5-5 steps from 10 µs (a finish whose writes already
// completed; the p99 target is 100 µs) to 10 s (a monolithic send of a long
// prompt over a slow link). Anything slower lands in +Inf, which is what a
// 30 s finish timeout looks like.
var DurationBuckets = []float64{
	10e-6, 25e-6, 50e-6,
	100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3,
	10e-3, 25e-3, 50e-3,
	100e-3, 250e-3, 500e-3,
	1, 2.5, 5,
	10,
}

// WithMetrics exports the engine's figures to reg as Prometheus metrics
// (names in the Metric* constants). A nil reg, typed or not, adds nothing,
// so a caller may pass its optional registry unconditionally; without this
// option the engine keeps no metrics at all.
//
// Several engines may share one registry, one after the other or side by
// side: the counters and histograms are shared and add up, and the gauges
// sum over the engines still open (kvstream_healthy is 0 when any of them is
// unhealthy). To tell engines apart, pass
// prometheus.WrapRegistererWith(prometheus.Labels{"engine": ...}, reg).
//
// Registration cannot fail New: a collector that clashes with one of another
// kind already in reg is logged at WARN and left out.
func WithMetrics(reg prometheus.Registerer) Option {
	if isNil(reg) {
		return func(*options) {}
	}
	// Built when the option is applied, not here: one Option value may serve
	// several engines (the sim builds one per mode), each with its own
	// observer and gauge membership.
	return func(o *options) {
		fam, regErr := registerFamilies(reg)
		o.observers = append(o.observers, newMetricsObserver(fam))
		o.started = append(o.started, func(e *Engine) {
			if regErr != nil {
				e.log.Warn("some kvstream metrics are not exported", stderrs.WarnField(regErr))
			}
			fam.gauges.add(e)
		})
	}
}

func isNil(reg prometheus.Registerer) bool {
	if reg == nil {
		return true
	}
	v := reflect.ValueOf(reg)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func, reflect.Slice, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// families are the collectors, as registered (or as already present in the
// registry, when an earlier engine registered them).
type families struct {
	postedBytes, postedBlocks *prometheus.CounterVec // part
	batches                   *prometheus.CounterVec // result
	eventWait, batchSeconds   *prometheus.HistogramVec
	chunkTransfer             prometheus.Histogram
	finish, exposed           prometheus.Histogram
	exposedPhase              *prometheus.HistogramVec // phase
	batchPhase                *prometheus.HistogramVec // part, phase
	registrations             *prometheus.CounterVec   // mode, reason
	refused                   *prometheus.CounterVec   // reason
	chunks                    *prometheus.CounterVec   // status
	timeouts                  prometheus.Counter
	resent, resumed, overdue  prometheus.Counter
	restarts                  *prometheus.CounterVec // reason
	gauges                    *engineGauges
}

func histogram(name, help string) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{Name: name, Help: help, Buckets: DurationBuckets}
}

func newFamilies() *families {
	return &families{
		postedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricPostedBytes,
			Help: "Bytes of the batches posted to decode destinations, counted when each batch completed or failed; part is group (a layer group) or rest (hookless buffers, groups that never fired, or a whole monolithic chunk)."}, []string{"part"}),
		postedBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricPostedBlocks,
			Help: "Contiguous writes of the batches posted, counted when each batch completed or failed."}, []string{"part"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricBatches,
			Help: "Posted batches by outcome (ok, failed)."}, []string{"result"}),
		eventWait: prometheus.NewHistogramVec(histogram(MetricEventWait,
			"Time a submitter waited on the CUDA event that gates a posted batch."), []string{"part"}),
		batchSeconds: prometheus.NewHistogramVec(histogram(MetricBatchSeconds,
			"Post to completion (or failure) of each posted batch."), []string{"part"}),
		chunkTransfer: prometheus.NewHistogram(histogram(MetricChunkTransfer,
			"First post to last completion of each successful chunk context that posted anything.")),
		finish: prometheus.NewHistogram(histogram(MetricFinishSeconds,
			"Finish call to return, for every Finish that returned a chunk's result.")),
		exposed: prometheus.NewHistogram(histogram(MetricExposedTransfer,
			"Finish return minus the instant the chunk's forward ended on the device (its end-of-forward event completed): the transfer time the forward did not hide; 0 when the forward still ran at the return (chunks with a forward end only).")),
		exposedPhase: prometheus.NewHistogramVec(histogram(MetricExposedPhase,
			"The exposed transfer time of each chunk with a forward end, split at its last event wait that returned, last post and last landing: phase detect (forward ended on the device to the wait returned), post, land, finish (last landing to Finish returned). The phases of one chunk add up to its exposed time."), []string{"phase"}),
		batchPhase: prometheus.NewHistogramVec(histogram(MetricBatchPhase,
			"Each posted batch's life by phase: detect (its event completed on the device to the submitter's wait returned; only where the stream gives device timestamps), post (wait returned to posted), land (posted to completion)."), []string{"part", "phase"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRegistrations,
			Help: "Registrations that created a chunk context, by mode (per_layer, monolithic) and the guard's reason."}, []string{"mode", "reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRegistrationsRefused,
			Help: "Registrations refused, by reason (bad_input, unhealthy, closed, peer_lost, peer_removed, peer_draining, room_cancelled, cancelled)."}, []string{"reason"}),
		chunks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricChunks,
			Help: "Chunk contexts ended, by status (success, failed, dropped)."}, []string{"status"}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricTimeouts,
			Help: "Chunk contexts that failed because they did not complete within the finish timeout."}),
		resent: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricGroupsResent,
			Help: "Works (a layer group, or the rest, to one destination) re-sent on a fresh endpoint after their batch broke or their completion was overdue, counted when their chunk ended."}),
		resumed: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricChunksResumed,
			Help: "Chunk contexts that succeeded after re-sending at least one Work whose batch broke."}),
		overdue: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricBatchesOverdue,
			Help: "Batches whose completion had not come within their chunk's completion deadline: written off and their Work re-sent (or, past the resend limit, torn down), counted when their chunk ended."}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricSubmitterRestarts,
			Help: "Submitter restarts by reason (endpoint, device, panic)."}, []string{"reason"}),
		gauges: newEngineGauges(),
	}
}

// registerFamilies registers a fresh set of collectors, adopting those an
// earlier engine already registered in reg so that the figures add up. It
// returns a usable set even on error: a collector that could not be
// registered still counts, it is just not exported.
func registerFamilies(reg prometheus.Registerer) (*families, error) {
	f := newFamilies()
	var errs error
	adopt(reg, &f.postedBytes, &errs)
	adopt(reg, &f.postedBlocks, &errs)
	adopt(reg, &f.batches, &errs)
	adopt(reg, &f.eventWait, &errs)
	adopt(reg, &f.batchSeconds, &errs)
	adopt(reg, &f.chunkTransfer, &errs)
	adopt(reg, &f.finish, &errs)
	adopt(reg, &f.exposed, &errs)
	adopt(reg, &f.exposedPhase, &errs)
	adopt(reg, &f.batchPhase, &errs)
	adopt(reg, &f.registrations, &errs)
	adopt(reg, &f.refused, &errs)
	adopt(reg, &f.chunks, &errs)
	adopt(reg, &f.timeouts, &errs)
	adopt(reg, &f.resent, &errs)
	adopt(reg, &f.resumed, &errs)
	adopt(reg, &f.overdue, &errs)
	adopt(reg, &f.restarts, &errs)
	adopt(reg, &f.gauges, &errs)
	return f, errs
}

// adopt registers *c, or replaces it by the identical collector already in
// reg (the Prometheus idiom for collectors shared by several instances).
func adopt[C prometheus.Collector](reg prometheus.Registerer, c *C, errs *error) {
	err := reg.Register(*c)
	if err == nil {
		return
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			*c = existing
			return
		}
	}
	*errs = errors.CombineErrors(*errs, err)
}

// Label values, in the order of the observer's tables.
var (
	partLabels   = [...]string{"group", "rest"}
	resultLabels = [...]string{"ok", "failed"}
	modeLabels   = [...]string{cp.Monolithic: "monolithic", cp.PerLayer: "per_layer"}
	statusLabels = [...]string{messages.Succeeded: "success", messages.Failed: "failed", messages.Dropped: "dropped"}
	// refuseLabels are every class Engine.Register refuses with, so that
	// each series exists at 0 from the start.
	refuseLabels = [...]string{"bad_input", "unhealthy", "closed", "peer_lost", "peer_removed", "peer_draining", "room_cancelled", "cancelled"}
	// restartLabels are the reasons actors.SpawnSubmitters reports.
	restartLabels = [...]string{"endpoint", "device", "panic"}
	// exposedPhaseLabels and batchPhaseLabels are the phases of
	// kvstream_exposed_phase_seconds and kvstream_batch_phase_seconds.
	exposedPhaseLabels = [...]string{"detect", "post", "land", "finish"}
	batchPhaseLabels   = [...]string{"detect", "post", "land"}
)

// numReasons counts the guard's reasons (cp.Reason values 0..PerLayerOff).
const numReasons = int(cp.PerLayerOff) + 1

// validRegistrations are the (mode, reason) pairs the guard produces; only
// they exist from the start, so that a dashboard shows no impossible series.
var validRegistrations = [...]struct {
	mode   cp.Mode
	reason cp.Reason
}{
	{cp.PerLayer, cp.OneDestination},
	{cp.PerLayer, cp.SeveralDestinations},
	{cp.Monolithic, cp.SeveralDestinations},
	{cp.Monolithic, cp.AllDummy},
	{cp.Monolithic, cp.PerLayerOff},
}

// metricsObserver is one engine's Observer. It resolves every label
// combination once, so that an observation is an atomic add or a bucket
// search: no map lookup, no hashing, no allocation on the engine's
// goroutines. Resolving them up front also makes every series exist at 0,
// which rate() and absent-based alerts need.
type metricsObserver struct {
	f *families

	bytes, blocks       [len(partLabels)]prometheus.Counter
	eventWait, batchDur [len(partLabels)]prometheus.Observer
	batchPhase          [len(partLabels)][len(batchPhaseLabels)]prometheus.Observer
	exposedPhase        [len(exposedPhaseLabels)]prometheus.Observer
	batches             [len(resultLabels)]prometheus.Counter
	regs                [len(modeLabels)][numReasons]prometheus.Counter
	chunks              [len(statusLabels)]prometheus.Counter
	refused             [len(refuseLabels)]prometheus.Counter
	restarts            [len(restartLabels)]prometheus.Counter
}

var _ Observer = (*metricsObserver)(nil)

func newMetricsObserver(f *families) *metricsObserver {
	m := &metricsObserver{f: f}
	for i, p := range partLabels {
		m.bytes[i] = f.postedBytes.WithLabelValues(p)
		m.blocks[i] = f.postedBlocks.WithLabelValues(p)
		m.eventWait[i] = f.eventWait.WithLabelValues(p)
		m.batchDur[i] = f.batchSeconds.WithLabelValues(p)
		for j, ph := range batchPhaseLabels {
			m.batchPhase[i][j] = f.batchPhase.WithLabelValues(p, ph)
		}
	}
	for i, ph := range exposedPhaseLabels {
		m.exposedPhase[i] = f.exposedPhase.WithLabelValues(ph)
	}
	for i, r := range resultLabels {
		m.batches[i] = f.batches.WithLabelValues(r)
	}
	for _, v := range validRegistrations {
		m.regs[v.mode][v.reason] = f.registrations.WithLabelValues(modeLabels[v.mode], v.reason.String())
	}
	for i, s := range statusLabels {
		m.chunks[i] = f.chunks.WithLabelValues(s)
	}
	for i, r := range refuseLabels {
		m.refused[i] = f.refused.WithLabelValues(r)
	}
	for i, r := range restartLabels {
		m.restarts[i] = f.restarts.WithLabelValues(r)
	}
	return m
}

func seconds(from, to time.Time) (float64, bool) {
	if from.IsZero() || to.IsZero() {
		return 0, false
	}
	return max(to.Sub(from).Seconds(), 0), true
}

// Batch implements Observer. It runs on the transport's completion path.
func (m *metricsObserver) Batch(b Batch) {
	part := 0
	if b.Seq == messages.Rest {
		part = 1
	}
	result := 0
	if b.Err != nil {
		result = 1
	}
	m.bytes[part].Add(float64(b.Bytes))
	m.blocks[part].Add(float64(b.Blocks))
	m.batches[result].Inc()
	if s, ok := seconds(b.WaitStart, b.WaitEnd); ok {
		m.eventWait[part].Observe(s)
	}
	if s, ok := seconds(b.Posted, b.Done); ok {
		m.batchDur[part].Observe(s)
	}
	if b.Err != nil {
		return // a failed batch's phases are not a latency
	}
	if s, ok := seconds(b.Posted, b.Done); ok {
		m.batchPhase[part][2].Observe(s)
	}
	if s, ok := seconds(b.EventDone, b.WaitEnd); ok {
		m.batchPhase[part][0].Observe(s)
	}
	if s, ok := seconds(b.WaitEnd, b.Posted); ok {
		m.batchPhase[part][1].Observe(s)
	}
}

// Chunk implements Observer.
func (m *metricsObserver) Chunk(r messages.Result) {
	if i := int(r.Status); i >= 0 && i < len(m.chunks) {
		m.chunks[i].Inc()
	} else {
		m.f.chunks.WithLabelValues("unknown").Inc()
	}
	if r.Err != nil && errors.Is(r.Err, ErrTimeout) {
		m.f.timeouts.Inc()
	}
	if r.Stats.Overdue > 0 {
		m.f.overdue.Add(float64(r.Stats.Overdue))
	}
	if r.Stats.Resent > 0 {
		m.f.resent.Add(float64(r.Stats.Resent))
		if r.Status == messages.Succeeded {
			m.f.resumed.Inc()
		}
	}
	if r.Status == messages.Succeeded {
		if s, ok := seconds(r.Stats.FirstPost, r.Stats.LastDone); ok {
			m.f.chunkTransfer.Observe(s)
		}
	}
}

// Restarted implements Observer.
func (m *metricsObserver) Restarted(reason string) {
	for i, r := range restartLabels {
		if r == reason {
			m.restarts[i].Inc()
			return
		}
	}
	m.f.restarts.WithLabelValues(reason).Inc() // a reason added later; rare
}

// Registered implements Observer.
func (m *metricsObserver) Registered(r Registration) {
	mi, ri := int(r.Mode), int(r.Reason)
	if mi >= 0 && mi < len(m.regs) && ri >= 0 && ri < numReasons {
		if c := m.regs[mi][ri]; c != nil {
			c.Inc()
			return
		}
	}
	// A pair the guard does not produce today: still counted, never lost.
	mode := "unknown"
	if mi >= 0 && mi < len(modeLabels) {
		mode = modeLabels[mi]
	}
	m.f.registrations.WithLabelValues(mode, r.Reason.String()).Inc()
}

// Refused implements Observer.
func (m *metricsObserver) Refused(class string) {
	for i, c := range refuseLabels {
		if c == class {
			m.refused[i].Inc()
			return
		}
	}
	m.f.refused.WithLabelValues(class).Inc()
}

// Finished implements Observer.
func (m *metricsObserver) Finished(f FinishRecord) {
	m.f.finish.Observe(max(f.Latency.Seconds(), 0))
	if !f.Result.Stats.ForwardEnd.IsZero() {
		m.f.exposed.Observe(max(f.Exposed.Seconds(), 0))
	}
	if f.HasPhases {
		for i, d := range [...]time.Duration{f.Phases.Detect, f.Phases.Post, f.Phases.Land, f.Phases.Finish} {
			m.exposedPhase[i].Observe(d.Seconds())
		}
	}
}

// engineGauges is the collector of the gauges. It is one collector over a
// set of engines rather than GaugeFuncs over one, because a registry accepts
// a metric name once: engines that share a registry share the gauges, which
// sum over those still open.
type engineGauges struct {
	live, rooms, bytes, queued, healthy *prometheus.Desc

	mu      sync.Mutex
	engines []*Engine
}

func newEngineGauges() *engineGauges {
	return &engineGauges{
		live: prometheus.NewDesc(MetricActiveContexts,
			"Chunk contexts registered and not yet ended.", nil, nil),
		rooms: prometheus.NewDesc(MetricRoomsInFlight,
			"Rooms with a chunk context registered and not yet ended.", nil, nil),
		bytes: prometheus.NewDesc(MetricBytesInFlight,
			"Bytes of batches posted and not yet completed.", nil, nil),
		queued: prometheus.NewDesc(MetricSubmitQueueDepth,
			"Work items sent to submitters and not yet answered.", nil, nil),
		healthy: prometheus.NewDesc(MetricHealthy,
			"1 while every open engine accepts registrations; 0 while one refuses them as unhealthy (lost device, submitter restart storm).", nil, nil),
	}
}

func (g *engineGauges) add(e *Engine) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.engines = append(g.open(), e)
}

// open drops the closed engines (so that the registry does not keep them
// alive) and returns the rest. g.mu is held. It reads Engine.gone, which
// Close sets as it begins, and waits for nothing: a Close waiting for the
// calls in flight must not hold every scrape, nor New of an engine
// sharing the registry, until they returned.
func (g *engineGauges) open() []*Engine {
	kept := g.engines[:0]
	for _, e := range g.engines {
		if !e.gone.Load() {
			kept = append(kept, e)
		}
	}
	clear(g.engines[len(kept):])
	g.engines = kept
	return kept
}

// Describe implements prometheus.Collector.
func (g *engineGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.live
	ch <- g.rooms
	ch <- g.bytes
	ch <- g.queued
	ch <- g.healthy
}

// Collect implements prometheus.Collector. With no engine open it reports
// nothing: a closed engine has no state, and a stale 1 would hide that.
func (g *engineGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	engines := g.open()
	if len(engines) == 0 {
		g.mu.Unlock()
		return
	}
	var live, rooms, bytes, queued float64
	healthy := 1.0
	for _, e := range engines {
		s := e.Stats()
		live += float64(s.Live)
		rooms += float64(s.Rooms)
		bytes += float64(s.BytesInFlight)
		queued += float64(s.Queued)
		if s.Unhealthy != nil {
			healthy = 0
		}
	}
	g.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(g.live, prometheus.GaugeValue, live)
	ch <- prometheus.MustNewConstMetric(g.rooms, prometheus.GaugeValue, rooms)
	ch <- prometheus.MustNewConstMetric(g.bytes, prometheus.GaugeValue, bytes)
	ch <- prometheus.MustNewConstMetric(g.queued, prometheus.GaugeValue, queued)
	ch <- prometheus.MustNewConstMetric(g.healthy, prometheus.GaugeValue, healthy)
}
