package system

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/messages"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// finishes records FinishRecords.
type finishes struct {
	NopObserver
	mu  sync.Mutex
	got []FinishRecord
}

func (f *finishes) Finished(r FinishRecord) {
	f.mu.Lock()
	f.got = append(f.got, r)
	f.mu.Unlock()
}

func (f *finishes) only(t *testing.T) FinishRecord {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.got, 1)
	return f.got[0]
}

// untimed hides the device timestamps of a stream's events, like a driver
// stream that has none.
type untimed struct{ s cuda.Stream }

func (u untimed) Record() (cuda.Event, error) {
	ev, err := u.s.Record()
	if err != nil {
		return nil, err
	}
	return struct{ cuda.Event }{ev}, nil
}

type exposureRig struct {
	stream *sim.Stream
	spans  chan sim.Span
	eng    *Engine
	obs    *finishes
	reg    *prometheus.Registry
}

// newExposureRig is an engine on its own virtual GPU stream (timed, or
// hiding timestamps) with `buffers` MLA buffers over `hooks` hook layers,
// K = 1, and a decode peer "d".
func newExposureRig(t *testing.T, buffers, hooks int, timed bool) *exposureRig {
	t.Helper()
	r := &exposureRig{spans: make(chan sim.Span, 64), obs: &finishes{}, reg: prometheus.NewRegistry()}
	gpu := sim.New(sim.Options{OnSpan: func(s sim.Span) { r.spans <- s }})
	t.Cleanup(gpu.Close)
	r.stream = gpu.NewStream("compute")
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("p")
	require.NoError(t, err)
	dec, err := fab.NewTransport("d")
	require.NoError(t, err)
	src, err := hostmem.Alloc(buffers * itemLen * pages)
	require.NoError(t, err)
	dst, err := hostmem.Alloc(buffers * itemLen * pages)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pre.Close(); _ = dec.Close(); _ = src.Free(); _ = dst.Free() })
	bases := func(b *hostmem.Block) []uint64 {
		out := make([]uint64, buffers)
		for i := range out {
			out[i] = b.Addr + uint64(i*itemLen*pages)
		}
		return out
	}
	var stream cuda.Stream = r.stream
	if !timed {
		stream = untimed{r.stream}
	}
	r.eng, err = New(Config{Buffers: MLABuffers(bases(src), itemLen, pages), HookLayers: hooks, PageSize: 4, GroupSize: 1},
		WithStream(stream), WithTransport(pre), WithLogger(zap.NewNop()), WithObserver(r.obs), WithMetrics(r.reg))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.eng.Close() })
	peer := Peer{ID: "d", Address: dec.Address()}
	for _, base := range bases(dst) {
		reg, err := dec.Register(base, itemLen*pages)
		require.NoError(t, err)
		peer.Buffers = append(peer.Buffers, PeerBuffer{Region: reg.Desc(), ItemLen: itemLen})
	}
	require.NoError(t, r.eng.AddPeer(peer))
	return r
}

func histogramSum(t *testing.T, g prometheus.Gatherer, name string, labels ...string) (float64, uint64) {
	t.Helper()
	m := series(t, g, name, labels...)
	require.NotNil(t, m, "%s%v", name, labels)
	return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
}

// The GPU runs a forward 100 ms behind the host: End() returns at once,
// the kernels end 100 ms (modeled) later. Exposed time starts when the
// device passed the end-of-forward event, so it is the transfer's tail,
// not the 100 ms the GPU ran behind.
func TestExposedStartsWhenTheGPUEnded(t *testing.T) {
	for _, timed := range []bool{true, false} {
		name := "device timestamp"
		if !timed {
			name = "wait returned"
		}
		t.Run(name, func(t *testing.T) {
			r := newExposureRig(t, 4, 3, timed) // buffer 3 is hookless: the rest waits on the end event
			ctx := context.Background()
			_, err := r.eng.Register(ctx, roomSpec(1))
			require.NoError(t, err)
			fw, err := r.eng.BeginForward()
			require.NoError(t, err)
			launched := time.Now()
			require.NoError(t, r.stream.Launch(sim.Kernel{Name: "forward", Duration: 100 * time.Millisecond}))
			for l := 0; l < 3; l++ {
				require.NoError(t, fw.LayerEnd(l))
			}
			require.NoError(t, fw.End())
			res, err := r.eng.Finish(ctx, 1)
			require.NoError(t, err)
			span := <-r.spans
			rec := r.obs.only(t)
			s := res.Stats

			require.False(t, s.ForwardDone.IsZero())
			assert.GreaterOrEqual(t, span.End.Sub(launched), 100*time.Millisecond, "the sim ends the kernel 100 ms after its launch")
			if timed {
				assert.True(t, s.ForwardDone.Equal(span.End.Round(0)), "device timestamp %v, kernel end %v", s.ForwardDone, span.End)
			} else {
				assert.False(t, s.ForwardDone.Before(span.End.Round(0)), "a wait cannot return before the kernel ended")
			}
			assert.False(t, s.ForwardDone.Before(s.ForwardEnd), "the host queued the end before the device passed it")
			assert.Equal(t, rec.Returned.Sub(s.ForwardDone), s.Exposed)
			assert.Equal(t, s.Exposed, rec.Exposed)
			// The old reading, from the host's End() call, would have
			// counted the 100 ms the GPU ran behind.
			assert.GreaterOrEqual(t, rec.Returned.Sub(s.ForwardEnd)-s.Exposed, s.ForwardDone.Sub(s.ForwardEnd))
			ph := rec.Phases
			require.True(t, rec.HasPhases)
			assert.Equal(t, s.Exposed, ph.Detect+ph.Post+ph.Land+ph.Finish, "the phases add up to the exposed time")

			sum, n := histogramSum(t, r.reg, MetricExposedTransfer)
			assert.Equal(t, uint64(1), n)
			assert.InDelta(t, s.Exposed.Seconds(), sum, 1e-9)
			var phases float64
			for _, p := range exposedPhaseLabels {
				v, n := histogramSum(t, r.reg, MetricExposedPhase, "phase", p)
				assert.Equal(t, uint64(1), n, p)
				phases += v
			}
			assert.InDelta(t, s.Exposed.Seconds(), phases, 1e-9)
			if timed {
				_, n := histogramSum(t, r.reg, MetricBatchPhase, "part", "rest", "phase", "detect")
				assert.Equal(t, uint64(1), n, "the rest batch's detection delay is measured from the device timestamp")
			}
		})
	}
}

// A chunk whose bytes all landed while its forward still ran on the device
// (every buffer has a hook; the forward's last kernel writes no KV) exposed
// nothing.
func TestExposedZeroWhileTheGPURuns(t *testing.T) {
	r := newExposureRig(t, 4, 4, true)
	ctx := context.Background()
	_, err := r.eng.Register(ctx, roomSpec(1))
	require.NoError(t, err)
	fw, err := r.eng.BeginForward()
	require.NoError(t, err)
	for l := 0; l < 4; l++ {
		require.NoError(t, fw.LayerEnd(l))
	}
	release := make(chan struct{})
	require.NoError(t, r.stream.Launch(sim.Kernel{Name: "lm_head", Start: func() { <-release }}))
	require.NoError(t, fw.End())
	res, err := r.eng.Finish(ctx, 1)
	close(release)
	require.NoError(t, err)
	assert.True(t, res.Stats.ForwardDone.IsZero())
	assert.Zero(t, res.Stats.Exposed)
	sum, n := histogramSum(t, r.reg, MetricExposedTransfer)
	assert.Equal(t, uint64(1), n)
	assert.Zero(t, sum)
}

// Each batch phase, computed by hand: its event completed at 0, the wait
// returned at 1 ms, it was posted at 3 ms and landed at 6 ms.
func TestBatchPhasesByHand(t *testing.T) {
	reg := prometheus.NewRegistry()
	fam, err := registerFamilies(reg)
	require.NoError(t, err)
	m := newMetricsObserver(fam)
	t0 := time.Unix(100, 0)
	ms := func(x int) time.Time { return t0.Add(time.Duration(x) * time.Millisecond) }
	m.Batch(Batch{Seq: 0, EventDone: t0, WaitStart: t0.Add(-time.Millisecond), WaitEnd: ms(1), Posted: ms(3), Done: ms(6)})
	for phase, want := range map[string]float64{"detect": 1e-3, "post": 2e-3, "land": 3e-3} {
		sum, n := histogramSum(t, reg, MetricBatchPhase, "part", "group", "phase", phase)
		assert.Equal(t, uint64(1), n, phase)
		assert.InDelta(t, want, sum, 1e-12, phase)
	}
	// Without a device timestamp there is no detect sample.
	m.Batch(Batch{Seq: 0, WaitEnd: ms(1), Posted: ms(3), Done: ms(6)})
	_, n := histogramSum(t, reg, MetricBatchPhase, "part", "group", "phase", "detect")
	assert.Equal(t, uint64(1), n)
}

// timedStub is an end event that completed at a given device instant.
type timedStub struct{ at time.Time }

func (timedStub) Query() (bool, error)             { return true, nil }
func (timedStub) Wait(context.Context) error       { return nil }
func (s timedStub) CompletedAt() (time.Time, bool) { return s.at, true }

// The exposed time and its phases, computed by hand.
func TestExposurePhasesByHand(t *testing.T) {
	t0 := time.Unix(200, 0)
	ms := func(x float64) time.Time { return t0.Add(time.Duration(x * float64(time.Millisecond))) }
	e := &Engine{}
	e.ends.put(7, timedStub{at: t0})
	for _, tc := range []struct {
		name                     string
		wait, post, done, ret    time.Time
		detect, postD, land, fin float64 // ms
	}{
		{"in order", ms(1), ms(1.5), ms(4), ms(5), 1, 0.5, 2.5, 1},
		// Everything but the finish was over before the forward ended.
		{"hidden", ms(-3), ms(-2), ms(-1), ms(0.25), 0, 0, 0, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Result{Stats: messages.Stats{Forward: 7, ForwardEnd: t0.Add(-time.Second), LastWait: tc.wait, LastPost: tc.post, LastDone: tc.done}}
			ph, ok := e.exposure(&r, tc.ret)
			require.True(t, ok)
			assert.True(t, r.Stats.ForwardDone.Equal(t0), "the device timestamp, not the host's End() a second earlier")
			assert.Equal(t, tc.ret.Sub(t0), r.Stats.Exposed)
			d := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
			assert.Equal(t, Phases{Detect: d(tc.detect), Post: d(tc.postD), Land: d(tc.land), Finish: d(tc.fin)}, ph)
		})
	}
}

// The end events kept for Finish stay bounded, gaps in the forward ids
// (forwards without chunks) included.
func TestForwardEndsBounded(t *testing.T) {
	var f forwardEnds
	var last uint64
	for id := uint64(1); id <= 20*keptEnds; id += 3 {
		f.put(id, timedStub{})
		last = id
	}
	f.mu.Lock()
	n := len(f.m)
	f.mu.Unlock()
	assert.LessOrEqual(t, n, 2*keptEnds+1)
	assert.NotNil(t, f.get(last), "the latest forward is kept")
	assert.NotNil(t, f.get(last-3*1000), "so are the forwards within keptEnds of it")
	assert.Nil(t, f.get(1), "an old one is not")
}
