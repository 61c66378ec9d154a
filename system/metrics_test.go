package system

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/messages"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

type metricsRig struct {
	group   int
	timeout time.Duration
	env     map[string]string
	faults  func(rdmafault.BatchInfo) rdmafault.Fault
	log     *zap.Logger // default: none
	single  bool        // Config.SingleDestinationPerLayer
}

// newMetricsEngine is newEngine with metrics on reg: 4 MLA buffers (3 hook
// layers, so buffer 3 is hookless and goes as the rest) and a decode peer
// "d" with 16 pages, on a private fabric.
func newMetricsEngine(t testing.TB, reg prometheus.Registerer, rig metricsRig) *Engine {
	t.Helper()
	p := newEnginePools(t)
	var tr rdma.Transport = p.pre
	if rig.faults != nil {
		tr = rdmafault.Wrap(p.pre, rig.faults)
	}
	if rig.log == nil {
		rig.log = zap.NewNop()
	}
	e, err := New(Config{Buffers: p.buffers, HookLayers: 3, PageSize: 4,
		GroupSize: rig.group, FinishTimeout: rig.timeout, SingleDestinationPerLayer: rig.single},
		WithTransport(tr), withSimulated(), WithLogger(rig.log), WithGetenv(func(k string) string { return rig.env[k] }),
		WithMetrics(reg))
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	require.NoError(t, e.AddPeer(p.peer))
	return e
}

// roomSpec is a whole 4-page request: source pages 4r-4..4r-1 to decode
// pages 4r..4r+3 (one run, so one block per buffer).
func roomSpec(room uint64) ChunkSpec {
	s := int(room-1) * 4
	return ChunkSpec{Room: room, Start: 0, End: 16, Last: true, SrcPages: []int{s, s + 1, s + 2, s + 3}, TotalPages: 4,
		Infos: []DecodeInfo{{Peer: "d", DstPages: []int{s + 4, s + 5, s + 6, s + 7}}}}
}

// series finds the sample of family name whose labels are exactly the given
// name/value pairs; nil if the family or the series is absent.
func series(t *testing.T, g prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	t.Helper()
	require.Zero(t, len(labels)%2, "labels come in name/value pairs")
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels)/2 {
				continue
			}
			for i, lp := range m.GetLabel() {
				if lp.GetName() != labels[2*i] || lp.GetValue() != labels[2*i+1] {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}

// counter returns a counter's value (the series must exist).
func counter(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	m := series(t, g, name, labels...)
	require.NotNil(t, m, "%s%v", name, labels)
	require.NotNil(t, m.GetCounter(), "%s is not a counter", name)
	return m.GetCounter().GetValue()
}

// gauge returns a gauge's value (the series must exist).
func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	m := series(t, g, name)
	require.NotNil(t, m, name)
	return m.GetGauge().GetValue()
}

// samples returns how many observations a histogram series holds.
func samples(t *testing.T, g prometheus.Gatherer, name string, labels ...string) uint64 {
	t.Helper()
	m := series(t, g, name, labels...)
	require.NotNil(t, m, "%s%v", name, labels)
	require.NotNil(t, m.GetHistogram(), "%s is not a histogram", name)
	return m.GetHistogram().GetSampleCount()
}

// The scenario of the issue: two one-chunk rooms, per-layer, 3 hook layers
// in groups of 2 (groups {0,1} and {2}) plus hookless buffer 3, one forward.
// Every figure is known exactly.
func TestMetricsCountAKnownWorkload(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newMetricsEngine(t, reg, metricsRig{group: 2})
	ctx := context.Background()

	for _, room := range []uint64{1, 2} {
		r, err := e.Register(ctx, roomSpec(room))
		require.NoError(t, err)
		require.Equal(t, PerLayer, r.Mode)
	}
	r, err := e.Register(ctx, roomSpec(1))
	require.NoError(t, err)
	require.True(t, r.Existing)
	assert.Equal(t, 2.0, counter(t, reg, MetricRegistrations, "mode", "per_layer", "reason", "one_destination"),
		"a re-registration of an active chunk is not a registration")
	assert.Equal(t, 0.0, counter(t, reg, MetricRegistrations, "mode", "monolithic", "reason", "several_destinations"),
		"every combination the guard produces exists from the start, at 0")
	assert.Nil(t, series(t, reg, MetricRegistrations, "mode", "per_layer", "reason", "all_dummy"),
		"and no impossible one")
	assert.Equal(t, 2.0, gauge(t, reg, MetricActiveContexts))
	assert.Equal(t, 1.0, gauge(t, reg, MetricHealthy))

	fw, err := e.BeginForward()
	require.NoError(t, err)
	for l := range 3 {
		require.NoError(t, fw.LayerEnd(l))
	}
	require.NoError(t, fw.End())
	var bytes, blocks float64
	for _, room := range []uint64{1, 2} {
		res, err := e.Finish(ctx, room)
		require.NoError(t, err)
		require.Equal(t, Succeeded, res.Status)
		require.Equal(t, 3, res.Stats.Batches)
		bytes += float64(res.Stats.Bytes)
		blocks += float64(res.Stats.Blocks)
	}

	// Per chunk: group {0,1} (buffers 0, 1), group {2} (buffer 2), the rest
	// (buffer 3); 4 pages of 32 bytes per buffer, one run.
	assert.Equal(t, 6.0, counter(t, reg, MetricBatches, "result", "ok"))
	assert.Equal(t, 0.0, counter(t, reg, MetricBatches, "result", "failed"))
	assert.Equal(t, 2*3*4*32.0, counter(t, reg, MetricPostedBytes, "part", "group"))
	assert.Equal(t, 2*1*4*32.0, counter(t, reg, MetricPostedBytes, "part", "rest"))
	assert.Equal(t, bytes, counter(t, reg, MetricPostedBytes, "part", "group")+counter(t, reg, MetricPostedBytes, "part", "rest"),
		"the metric and the per-request Stats agree")
	assert.Equal(t, 6.0, counter(t, reg, MetricPostedBlocks, "part", "group"))
	assert.Equal(t, 2.0, counter(t, reg, MetricPostedBlocks, "part", "rest"))
	assert.Equal(t, blocks, 8.0)
	for part, n := range map[string]uint64{"group": 4, "rest": 2} {
		assert.Equal(t, n, samples(t, reg, MetricEventWait, "part", part), part)
		assert.Equal(t, n, samples(t, reg, MetricBatchSeconds, "part", part), part)
	}
	assert.Equal(t, uint64(2), samples(t, reg, MetricFinishSeconds))
	assert.Equal(t, uint64(2), samples(t, reg, MetricExposedTransfer))
	assert.Equal(t, uint64(2), samples(t, reg, MetricChunkTransfer))
	assert.Equal(t, 2.0, counter(t, reg, MetricChunks, "status", "success"))
	assert.Equal(t, 0.0, counter(t, reg, MetricChunks, "status", "failed"))
	assert.Equal(t, 0.0, counter(t, reg, MetricTimeouts))
	assert.Equal(t, 0.0, counter(t, reg, MetricSubmitterRestarts, "reason", "endpoint"))
	assert.Equal(t, 0.0, gauge(t, reg, MetricActiveContexts), "Finish returns after the context ended")
	assert.Equal(t, 0.0, gauge(t, reg, MetricSubmitQueueDepth))

	bad := roomSpec(3)
	bad.Start = 3
	_, err = e.Register(ctx, bad)
	require.True(t, errors.Is(err, ErrBadInput))
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrationsRefused, "reason", "bad_input"))

	require.NoError(t, e.Close())
	_, err = e.Register(ctx, roomSpec(3))
	require.True(t, errors.Is(err, ErrClosed))
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrationsRefused, "reason", "closed"))
	assert.Nil(t, series(t, reg, MetricHealthy), "a closed engine reports no state")
	assert.Equal(t, 6.0, counter(t, reg, MetricBatches, "result", "ok"), "counters outlive the engine")
}

// TestGaugesOfWorkInFlight: the rooms and the bytes in flight, each
// against a case computed by hand: two rooms registered, their batches
// posted and their completions held (lost), then dropped.
func TestGaugesOfWorkInFlight(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newMetricsEngine(t, reg, metricsRig{group: 2, timeout: 2 * time.Second, faults: func(rdmafault.BatchInfo) rdmafault.Fault {
		return rdmafault.Fault{Kind: rdmafault.LoseCompletion}
	}})
	ctx := context.Background()
	assert.Equal(t, 0.0, gauge(t, reg, MetricRoomsInFlight))
	assert.Equal(t, 0.0, gauge(t, reg, MetricBytesInFlight))
	for _, room := range []uint64{1, 2} {
		_, err := e.Register(ctx, roomSpec(room))
		require.NoError(t, err)
	}
	assert.Equal(t, 2.0, gauge(t, reg, MetricRoomsInFlight))
	fw, err := e.BeginForward()
	require.NoError(t, err)
	for l := range 3 {
		require.NoError(t, fw.LayerEnd(l))
	}
	require.NoError(t, fw.End())
	// Every batch is posted (3 per room: groups {0,1} and {2}, and the
	// rest) and none completes: 2 rooms x 4 buffers x 4 pages x 32 bytes.
	want := 2 * 4 * 4 * float64(itemLen)
	require.Eventually(t, func() bool { return gauge(t, reg, MetricBytesInFlight) == want }, 10*time.Second, time.Millisecond,
		"bytes in flight: %v, want %v", gauge(t, reg, MetricBytesInFlight), want)
	for _, room := range []uint64{1, 2} {
		_ = e.Drop(ctx, room) // the teardown fails the lost batches
	}
	assert.Equal(t, 0.0, gauge(t, reg, MetricRoomsInFlight), "dropped rooms are not in flight")
	assert.Equal(t, 0.0, gauge(t, reg, MetricBytesInFlight), "the teardown failed the batches in flight")
}

// A scrape while Close waits for a Finish still in flight used to block, and
// with it every other scrape and any engine joining the registry, until
// that Finish returned: up to its finish timeout. The gauges ask whether
// an engine is closed without waiting for Close.
func TestGaugesDoNotWaitForClose(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newMetricsEngine(t, reg, metricsRig{group: 2, timeout: 10 * time.Minute})
	ctx := context.Background()
	_, err := e.Register(ctx, roomSpec(1))
	require.NoError(t, err)
	fw, err := e.BeginForward()
	require.NoError(t, err)
	finished := make(chan error, 1)
	go func() { // bound to the forward, which has not ended: it waits
		_, err := e.Finish(ctx, 1)
		finished <- err
	}()
	require.Eventually(t, func() bool { return e.calls.n.Load() == 1 }, time.Minute, time.Millisecond, "the Finish is in flight")
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	require.Eventually(t, func() bool { return e.calls.n.Load() == gateClosed|1 }, time.Minute, time.Millisecond, "Close waits for the Finish")

	gathered := make(chan error, 1)
	go func() {
		_, err := reg.Gather()
		gathered <- err
	}()
	select {
	case err := <-gathered:
		require.NoError(t, err)
	case <-time.After(time.Minute): // the Finish would hold Close for ten
		t.Error("the scrape waited for Close, which waits for the Finish")
		defer func() { <-gathered }()
	}
	require.NoError(t, fw.End())
	require.NoError(t, <-finished)
	require.NoError(t, <-closed)
}

// A completion that fails and completions that never come: both chunks
// FAILED, the second one by its timeout (its Work is re-sent at each
// completion deadline, and every post of it is lost: four deadlines do not
// fit in the timeout).
func TestMetricsCountFailuresAndTimeouts(t *testing.T) {
	reg := prometheus.NewRegistry()
	const timeout = 300 * time.Millisecond
	e := newMetricsEngine(t, reg, metricsRig{group: 2, timeout: timeout, faults: func(b rdmafault.BatchInfo) rdmafault.Fault {
		switch b.Seq {
		case 1:
			return rdmafault.Fault{Kind: rdmafault.FailCompletion}
		}
		return rdmafault.Fault{Kind: rdmafault.LoseCompletion}
	}})
	ctx := context.Background()

	// No forward: Finish sends the whole chunk as one rest batch.
	_, err := e.Register(ctx, roomSpec(1))
	require.NoError(t, err)
	res, err := e.Finish(ctx, 1)
	require.Error(t, err)
	require.Equal(t, Failed, res.Status)
	assert.False(t, errors.Is(err, ErrTimeout), "%v", err)
	assert.Equal(t, 1.0, counter(t, reg, MetricChunks, "status", "failed"))
	assert.Equal(t, 0.0, counter(t, reg, MetricChunks, "status", "success"))
	assert.Equal(t, 1.0, counter(t, reg, MetricBatches, "result", "failed"))
	assert.Equal(t, 0.0, counter(t, reg, MetricTimeouts))
	assert.Equal(t, uint64(1), samples(t, reg, MetricFinishSeconds))
	assert.Equal(t, uint64(0), samples(t, reg, MetricExposedTransfer), "no forward end, no exposed time")
	assert.Equal(t, uint64(0), samples(t, reg, MetricChunkTransfer), "only successful chunks have a transfer window")

	_, err = e.Register(ctx, roomSpec(2))
	require.NoError(t, err)
	res, err = e.Finish(ctx, 2)
	require.Error(t, err)
	require.Equal(t, Failed, res.Status)
	require.True(t, errors.Is(err, ErrTimeout), "%v", err)
	assert.Equal(t, 2.0, counter(t, reg, MetricChunks, "status", "failed"))
	assert.Equal(t, 1.0, counter(t, reg, MetricTimeouts))
	assert.Equal(t, uint64(2), samples(t, reg, MetricFinishSeconds))
	// Each post of the lost Work is failed once: by the Close of a resume,
	// or the last one by the chunk's teardown.
	posts := float64(1 + res.Stats.Resent)
	require.Eventually(t, func() bool { return counter(t, reg, MetricBatches, "result", "failed") == 1+posts },
		5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 0.0, counter(t, reg, MetricBatches, "result", "ok"))
}

// TestMetricsCountResumes: a chunk whose batch broke twice resumes and
// succeeds (two Works re-sent, one chunk resumed); one whose every batch
// breaks gives up at the resend limit and fails closed.
func TestMetricsCountResumes(t *testing.T) {
	reg := prometheus.NewRegistry()
	var breakAll atomic.Bool
	e := newMetricsEngine(t, reg, metricsRig{group: 2, timeout: 5 * time.Second, faults: func(b rdmafault.BatchInfo) rdmafault.Fault {
		if b.Seq <= 2 || breakAll.Load() {
			return rdmafault.Fault{Kind: rdmafault.BreakEndpoint}
		}
		return rdmafault.Fault{}
	}})
	ctx := context.Background()

	_, err := e.Register(ctx, roomSpec(1))
	require.NoError(t, err)
	res, err := e.Finish(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, Succeeded, res.Status)
	assert.Equal(t, 2, res.Stats.Resent)
	assert.Equal(t, 2.0, counter(t, reg, MetricGroupsResent))
	assert.Equal(t, 1.0, counter(t, reg, MetricChunksResumed))

	breakAll.Store(true)
	_, err = e.Register(ctx, roomSpec(2))
	require.NoError(t, err)
	res, err = e.Finish(ctx, 2)
	require.Error(t, err)
	require.Equal(t, Failed, res.Status)
	assert.True(t, errors.Is(err, ErrResendLimit), "%v", err)
	assert.False(t, errors.Is(err, ErrTimeout), "it gave up before its timeout: %v", err)
	assert.Equal(t, 2.0+float64(actors.ResendLimit), counter(t, reg, MetricGroupsResent))
	assert.Equal(t, 1.0, counter(t, reg, MetricChunksResumed), "a chunk that failed did not resume")
}

// TestMetricsCountLostCompletionResumed: a batch whose completion never
// comes is written off at its completion deadline, its endpoint closed (the
// Close fails the batch) and its Work re-sent: the chunk succeeds, one Work
// re-sent, one chunk resumed.
func TestMetricsCountLostCompletionResumed(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newMetricsEngine(t, reg, metricsRig{group: 2, timeout: 2 * time.Second, faults: func(b rdmafault.BatchInfo) rdmafault.Fault {
		if b.Seq == 1 {
			return rdmafault.Fault{Kind: rdmafault.LoseCompletion}
		}
		return rdmafault.Fault{}
	}})
	ctx := context.Background()
	_, err := e.Register(ctx, roomSpec(1))
	require.NoError(t, err)
	res, err := e.Finish(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, Succeeded, res.Status)
	assert.Equal(t, 1, res.Stats.Resent)
	assert.Equal(t, 1, res.Stats.Overdue)
	assert.Equal(t, 1.0, counter(t, reg, MetricGroupsResent))
	assert.Equal(t, 1.0, counter(t, reg, MetricChunksResumed))
	assert.Equal(t, 1.0, counter(t, reg, MetricBatchesOverdue))
	assert.Equal(t, 1.0, counter(t, reg, MetricBatches, "result", "failed"), "the resume's Close failed the lost batch")
	assert.Equal(t, 1.0, counter(t, reg, MetricBatches, "result", "ok"))
}

// The guard's fallbacks are counted by reason, and engines that share a
// registry (the sim runs one per mode) add up instead of clashing.
func TestMetricsFallbacksAndSharedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	ctx := context.Background()

	e := newMetricsEngine(t, reg, metricsRig{})
	several := roomSpec(1)
	several.Infos = append(several.Infos, DecodeInfo{Peer: "d", DstPages: []int{12, 13, 14, 15}})
	dummy := roomSpec(2)
	dummy.Infos[0].Dummy = true
	for _, s := range []ChunkSpec{several, dummy} {
		r, err := e.Register(ctx, s)
		require.NoError(t, err)
		require.Equal(t, s.Infos[0].Dummy, r.Mode == Monolithic, "several destinations stream per layer, dummies send nothing")
	}
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrations, "mode", "per_layer", "reason", "several_destinations"))
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrations, "mode", "monolithic", "reason", "all_dummy"))

	ref := newMetricsEngine(t, reg, metricsRig{single: true})
	r, err := ref.Register(ctx, several)
	require.NoError(t, err)
	require.Equal(t, Monolithic, r.Mode, "the reference rule")
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrations, "mode", "monolithic", "reason", "several_destinations"))
	require.NoError(t, ref.Close()) // drops its room

	off := newMetricsEngine(t, reg, metricsRig{env: map[string]string{EnvPerLayer: "0"}})
	r, err = off.Register(ctx, roomSpec(1))
	require.NoError(t, err)
	require.Equal(t, Monolithic, r.Mode)
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrations, "mode", "monolithic", "reason", "per_layer_off"))
	assert.Equal(t, 3.0, gauge(t, reg, MetricActiveContexts), "the gauges sum over the open engines")

	require.NoError(t, e.Close())
	assert.Equal(t, 1.0, gauge(t, reg, MetricActiveContexts), "a closed engine leaves the sum")
	_, err = off.Finish(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, 1.0, counter(t, reg, MetricChunks, "status", "success"))
	assert.Equal(t, 3.0, counter(t, reg, MetricChunks, "status", "dropped"), "Close dropped the first two engines' rooms")
}

// Engines told apart by a wrapping registerer get their own series.
func TestMetricsWrappedRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, rank := range []string{"0", "1"} {
		e := newMetricsEngine(t, prometheus.WrapRegistererWith(prometheus.Labels{"engine": rank}, reg), metricsRig{})
		_, err := e.Register(context.Background(), roomSpec(1))
		require.NoError(t, err)
	}
	for _, rank := range []string{"0", "1"} {
		assert.Equal(t, 1.0, counter(t, reg, MetricRegistrations, "engine", rank, "mode", "per_layer", "reason", "one_destination"))
	}
}

func TestWithMetricsNilIsOff(t *testing.T) {
	var typed *prometheus.Registry
	for _, reg := range []prometheus.Registerer{nil, typed} {
		e := newMetricsEngine(t, reg, metricsRig{})
		_, err := e.Register(context.Background(), roomSpec(1))
		require.NoError(t, err)
		_, err = e.Finish(context.Background(), 1)
		require.NoError(t, err)
	}
}

// A registry that already holds a different collector under a kvstream name
// costs that metric, not the engine.
func TestMetricsClashIsNotFatal(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricTimeouts, Help: "someone else's"}))
	core, logs := observer.New(zapcore.WarnLevel)
	e := newMetricsEngine(t, reg, metricsRig{log: zap.New(core)})
	_, err := e.Register(context.Background(), roomSpec(1))
	require.NoError(t, err)
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrations, "mode", "per_layer", "reason", "one_destination"))
	warns := logs.FilterMessage("some kvstream metrics are not exported").All()
	require.Len(t, warns, 1)
	assert.Contains(t, warns[0].ContextMap()["error"], MetricTimeouts)
}

func TestMetricsFollowPrometheusConventions(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newMetricsEngine(t, reg, metricsRig{})
	_, err := e.Register(context.Background(), roomSpec(1))
	require.NoError(t, err)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	require.NoError(t, err)
	assert.Empty(t, problems)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{MetricPostedBytes, MetricPostedBlocks, MetricBatches, MetricEventWait, MetricBatchSeconds,
		MetricChunkTransfer, MetricFinishSeconds, MetricExposedTransfer, MetricRegistrations, MetricRegistrationsRefused,
		MetricChunks, MetricTimeouts, MetricSubmitterRestarts, MetricActiveContexts, MetricSubmitQueueDepth, MetricHealthy} {
		assert.True(t, names[n], "%s is exported", n)
	}
}

func TestMetricsObserverLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, err := registerFamilies(reg)
	require.NoError(t, err)
	m := newMetricsObserver(f)
	m.Restarted("endpoint")
	m.Restarted("later")
	m.Refused("unhealthy")
	m.Chunk(messages.Result{Status: Failed, Err: errors.Wrap(ErrTimeout, "room 1 chunk 0")})
	m.Chunk(messages.Result{Status: Dropped})
	m.Registered(Registration{Mode: Monolithic, Reason: cp.OneDestination})
	assert.Equal(t, 1.0, counter(t, reg, MetricSubmitterRestarts, "reason", "endpoint"))
	assert.Equal(t, 1.0, counter(t, reg, MetricSubmitterRestarts, "reason", "later"), "an unforeseen reason is still counted")
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrationsRefused, "reason", "unhealthy"))
	assert.Equal(t, 1.0, counter(t, reg, MetricTimeouts), "a wrapped ErrTimeout is a timeout")
	assert.Equal(t, 1.0, counter(t, reg, MetricChunks, "status", "dropped"))
	assert.Equal(t, 1.0, counter(t, reg, MetricRegistrations, "mode", "monolithic", "reason", "one_destination"),
		"a pair the guard does not produce today is still counted")
}

// The observer runs on engine goroutines for every batch and every request:
// its success paths allocate nothing.
func TestMetricsObserverDoesNotAllocate(t *testing.T) {
	f, err := registerFamilies(prometheus.NewRegistry())
	require.NoError(t, err)
	m := newMetricsObserver(f)
	now := time.Now()
	b := Batch{Seq: 0, Bytes: 4096, Blocks: 2, WaitStart: now, WaitEnd: now.Add(time.Microsecond),
		Posted: now.Add(2 * time.Microsecond), Done: now.Add(time.Millisecond)}
	res := messages.Result{Status: Succeeded, Stats: messages.Stats{FirstPost: now, LastDone: now.Add(time.Millisecond), ForwardEnd: now}}
	fin := FinishRecord{Result: res, Latency: 50 * time.Microsecond, Exposed: time.Millisecond}
	reg := Registration{Mode: PerLayer}
	for name, f := range map[string]func(){
		"Batch":      func() { m.Batch(b) },
		"Chunk":      func() { m.Chunk(res) },
		"Finished":   func() { m.Finished(fin) },
		"Registered": func() { m.Registered(reg) },
		"Refused":    func() { m.Refused("bad_input") },
		"Restarted":  func() { m.Restarted("panic") },
	} {
		assert.Zero(t, testing.AllocsPerRun(100, f), name)
	}
}

// Invariant 11 with metrics on: a non-boundary LayerEnd of a forward with a
// bound chunk allocates nothing (no observer runs on the forward thread).
func TestLayerEndDoesNotAllocateWithMetrics(t *testing.T) {
	e := newMetricsEngine(t, prometheus.NewRegistry(), metricsRig{group: 2})
	_, err := e.Register(context.Background(), roomSpec(1))
	require.NoError(t, err)
	fw, err := e.BeginForward()
	require.NoError(t, err)
	var lerr error
	allocs := testing.AllocsPerRun(1000, func() { lerr = fw.LayerEnd(0) })
	require.NoError(t, lerr)
	assert.Zero(t, allocs)
	for l := range 3 {
		require.NoError(t, fw.LayerEnd(l))
	}
	require.NoError(t, fw.End())
	_, err = e.Finish(context.Background(), 1)
	require.NoError(t, err)
}

// BenchmarkLayerEndNonBoundaryWithMetrics is BenchmarkLayerEndNonBoundary
// (tests/bench_test.go) on a metrics-enabled engine: the same ≤ 20 ns and 0
// allocations.
func BenchmarkLayerEndNonBoundaryWithMetrics(b *testing.B) {
	e := newMetricsEngine(b, prometheus.NewRegistry(), metricsRig{group: 2})
	_, err := e.Register(context.Background(), roomSpec(1))
	require.NoError(b, err)
	fw, err := e.BeginForward()
	require.NoError(b, err)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := fw.LayerEnd(0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	require.NoError(b, fw.End())
	_, err = e.Finish(context.Background(), 1)
	require.NoError(b, err)
}

// BenchmarkMetricsObserverBatch is the cost metrics add to each completed
// batch, on the transport's completion path.
func BenchmarkMetricsObserverBatch(b *testing.B) {
	f, err := registerFamilies(prometheus.NewRegistry())
	require.NoError(b, err)
	m := newMetricsObserver(f)
	now := time.Now()
	batch := Batch{Bytes: 4096, Blocks: 2, WaitStart: now, WaitEnd: now.Add(time.Microsecond),
		Posted: now.Add(2 * time.Microsecond), Done: now.Add(time.Millisecond)}
	b.ReportAllocs()
	for b.Loop() {
		m.Batch(batch)
	}
}
