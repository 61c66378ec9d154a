package tests

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/lab/stallprobe"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// Each test here is one scenario of the per-layer transfer commit log,
// against the real engine (actors, submitters, loopback transport, virtual
// GPU), asserting bytes, statuses and order.

func seqPages(from, n int) []int { return seqFrom(from, n) }

// "event-wait-before-submit ordering": every write is posted after the
// kernel that wrote its layer ran, even with slow kernels.
func TestEventWaitBeforeSubmit(t *testing.T) {
	g := testbed.MLA(8, 64, 32)
	r := newRig(t, rigOpts{geom: g, hooks: 8, group: 2, layerTime: 3 * time.Millisecond})
	src, dst := seqPages(4, 6), seqPages(10, 6)
	r.register(chunk{room: 1, end: 24, last: true, src: src, total: 6, infos: oneInfo("d0", dst)})
	r.forward(testbed.Write{Room: 1, SrcPages: src, Tokens: 24})
	r.finish(1)
	r.expectPages(0, 1, seqPages(0, 6), dst)

	r.mu.Lock()
	defer r.mu.Unlock()
	layerEnd := map[string]time.Time{}
	for _, s := range r.spans {
		layerEnd[s.Name] = s.End
	}
	require.Len(t, layerEnd, 8)
	require.NotEmpty(t, r.landings)
	per := g.ItemLen * uint64(g.Pages)
	for _, l := range r.landings {
		b := int((l.Addr - r.decodes[0].Bases[0]) / per)
		end := layerEnd[testbed.KernelName(1, g.Layers[b])]
		assert.False(t, l.Posted.Before(end), "buffer %d posted %v before its layer's kernel ended", b, end.Sub(l.Posted))
	}
}

// "hookless buffers sent" (78 hooks over 79 buffers, the MTP layer) and
// "grouping boundaries including the last partial group": one batch per
// group of 8 plus one for the MTP buffer, bytes equal in all 79.
func TestMTPBufferAndPartialLastGroup(t *testing.T) {
	g := testbed.MLA(79, 32, 16)
	r := newRig(t, rigOpts{geom: g, hooks: 78, group: 8, layerTime: 100 * time.Microsecond})
	src, dst := []int{0, 1, 5, 6, 7}, []int{3, 4, 5, 9, 10}
	reg := r.register(chunk{room: 9, end: 20, last: true, src: src, total: 5, infos: oneInfo("d0", dst)})
	require.Equal(t, system.PerLayer, reg.Mode)
	r.forward(testbed.Write{Room: 9, SrcPages: src, Tokens: 20})
	res := r.finish(9)
	assert.Equal(t, 11, res.Stats.Batches, "10 groups (the last one of 6 layers) + the MTP buffer")
	assert.Equal(t, 10, res.Stats.Groups)
	assert.Equal(t, uint64(79*5*32), res.Stats.Bytes)
	r.expectPages(0, 9, seqPages(0, 5), dst)
}

// "later forwards do not re-feed a context": a chunk left unfinished while
// two more forwards re-fire every layer keeps a finish target of at most
// one batch per group plus the rest (the seed saw 3042-5538).
func TestLaterForwardsDoNotRefeed(t *testing.T) {
	g := testbed.MLA(16, 16, 64)
	r := newRig(t, rigOpts{geom: g, hooks: 16, group: 4})
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	for i := 0; i < 2; i++ {
		room := uint64(2 + i)
		src := []int{10 + 2*i, 11 + 2*i}
		r.register(chunk{room: room, end: 8, last: true, src: src, total: 2, infos: oneInfo("d0", []int{20 + 2*i, 21 + 2*i})})
		r.forward(testbed.Write{Room: room, SrcPages: src, Tokens: 8})
	}
	res := r.finish(1)
	assert.Equal(t, 4, res.Stats.Groups, "groups of its own forward only")
	assert.Equal(t, 4, res.Stats.Batches)
	assert.Zero(t, res.Stats.Ignored, "later forwards' groups never reached it")
	r.finish(2)
	r.finish(3)
	r.expectPages(0, 1, []int{0, 1}, []int{0, 1})
	r.expectPages(0, 3, []int{0, 1}, []int{22, 23})
}

// "register never overwrites an active context" and re-registration is a
// no-op: the ~9 registrations of one batch formation change nothing, and a
// registration of the same chunk with other pages is refused (it used to be
// accepted and silently ignored) and changes nothing either.
func TestRegisterNeverOverwrites(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2})
	first := r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{5, 6})})
	for i := 0; i < 9; i++ { // the scheduler re-iterates requests ~9x
		again := r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{5, 6})})
		assert.True(t, again.Existing)
		assert.Equal(t, first.Chunk, again.Chunk)
	}
	_, err := r.eng.Register(context.Background(), r.spec(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{40, 41})}))
	require.Error(t, err)
	assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "registered again with info 0 destination pages: page 40 at index 0, first registered as 5")
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	r.finish(1)
	r.expectPages(0, 1, []int{0, 1}, []int{5, 6})
	r.expectZero(0, []int{40, 41})
	_, err = r.eng.Finish(context.Background(), 1)
	require.Error(t, err, "one context, one finish")
	assert.True(t, errors.Is(err, system.ErrBadInput))
}

// "chunked FIFO": chunks of one room finish in send order, and chunk N > 0
// lands on its own decode pages (chunk_page_start), for a CP rank of 4.
func TestChunkedFIFOWithAbsolutePositions(t *testing.T) {
	g := testbed.KV(3, 16, 64)
	r := newRig(t, rigOpts{geom: g, hooks: 3, group: 2, pageSize: 4, cp: cp.CP{Size: 4, Rank: 1}})
	const total = 12 // 48 tokens, 3 chunks of 16
	src := seqPages(20, total)
	dst := seqPages(0, total)
	var starts []int
	for k := 0; k < 3; k++ {
		start, end := 16*k, 16*(k+1)
		r.register(chunk{room: 4, start: start, end: end, last: k == 2, src: src[4*k : 4*k+4], total: total, infos: oneInfo("d0", dst)})
		r.forward(testbed.Write{Room: 4, PageStart: 4 * k, SrcPages: src[4*k : 4*k+4], Tokens: 16})
		starts = append(starts, start)
	}
	for _, want := range starts {
		assert.Equal(t, want, r.finish(4).Chunk.Start, "finish pops the front")
	}
	owned := []int{1, 5, 9} // position % 4 == 1
	r.expectPages(0, 4, owned, owned)
	r.expectZero(0, []int{0, 2, 3, 4, 6, 7, 8, 10, 11})
	assert.False(t, r.eng.HasRoom(4))
}

// "drop drains all": dropping a room quiesces every queued chunk; the room
// is gone afterwards and the engine keeps serving.
func TestDropDrainsAll(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, layerTime: time.Millisecond})
	r.register(chunk{room: 1, end: 8, src: []int{0, 1}, total: 4, infos: oneInfo("d0", seqPages(0, 4))})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	r.register(chunk{room: 1, start: 8, end: 16, last: true, src: []int{2, 3}, total: 4, infos: oneInfo("d0", seqPages(0, 4))})
	require.True(t, r.eng.HasRoom(1))
	require.NoError(t, r.eng.Drop(context.Background(), 1))
	assert.False(t, r.eng.HasRoom(1))
	_, err := r.eng.Finish(context.Background(), 1)
	assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	assert.True(t, errors.Is(r.eng.Drop(context.Background(), 1), system.ErrBadInput))
	// After the drop returned nothing of room 1 lands any more.
	r.mu.Lock()
	n := len(r.landings)
	r.mu.Unlock()
	r.register(chunk{room: 2, end: 8, last: true, src: []int{8, 9}, total: 2, infos: oneInfo("d0", []int{30, 31})})
	r.forward(testbed.Write{Room: 2, SrcPages: []int{8, 9}, Tokens: 8})
	r.finish(2)
	r.expectPages(0, 2, []int{0, 1}, []int{30, 31})
	r.mu.Lock()
	for _, l := range r.landings[n:] {
		b := (l.Addr - r.decodes[0].Bases[0]) / (g.ItemLen * uint64(g.Pages))
		page := (l.Addr - r.decodes[0].Bases[b]) / g.ItemLen
		assert.GreaterOrEqual(t, page, uint64(30), "a write of the dropped room landed after Drop returned")
	}
	r.mu.Unlock()
}

// The register guard (invariant 8): two real destinations stream per layer
// to both (monolithic to both under the reference rule), one real destination
// is per-layer, all dummy sends nothing. Either way one context serves the
// room and one Finish completes it.
func TestRegisterGuard(t *testing.T) {
	for _, single := range []bool{false, true} {
		t.Run(fmt.Sprintf("single=%v", single), func(t *testing.T) {
			g := testbed.MLA(4, 16, 64)
			r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, decodes: 2, single: single})
			two := r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2,
				infos: []system.DecodeInfo{{Peer: "d0", DstPages: []int{0, 1}}, {Peer: "d1", DstPages: []int{2, 3}}}})
			if single {
				assert.Equal(t, system.Monolithic, two.Mode)
			} else {
				assert.Equal(t, system.PerLayer, two.Mode)
			}
			assert.Equal(t, cp.SeveralDestinations, two.Reason)
			one := r.register(chunk{room: 2, end: 8, last: true, src: []int{2, 3}, total: 2,
				infos: []system.DecodeInfo{{Peer: "d1", Dummy: true}, {Peer: "d0", DstPages: []int{4, 5}}}})
			assert.Equal(t, system.PerLayer, one.Mode)
			none := r.register(chunk{room: 3, end: 8, last: true, src: []int{4, 5}, total: 2,
				infos: []system.DecodeInfo{{Peer: "d0", Dummy: true}, {Peer: "d1", Dummy: true}}})
			assert.Equal(t, system.Monolithic, none.Mode)
			assert.Equal(t, cp.AllDummy, none.Reason)
			r.forward(
				testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8},
				testbed.Write{Room: 2, SrcPages: []int{2, 3}, Tokens: 8},
				testbed.Write{Room: 3, SrcPages: []int{4, 5}, Tokens: 8},
			)
			res := r.finish(1)
			if single {
				assert.Equal(t, 2, res.Stats.Batches, "monolithic: one batch per destination")
			} else {
				assert.Equal(t, 4, res.Stats.Batches, "per layer: one batch per group per destination")
			}
			assert.Equal(t, uint64(2*4*2*16), res.Stats.Bytes, "2 destinations x 4 buffers x 2 pages")
			r.finish(2)
			assert.Zero(t, r.finish(3).Stats.Bytes, "all dummy: nothing sent")
			_, err := r.eng.Finish(context.Background(), 1)
			require.True(t, errors.Is(err, system.ErrNoChunk), "one Finish completes the room, whatever its destinations")
			r.expectPages(0, 1, []int{0, 1}, []int{0, 1})
			r.expectPages(1, 1, []int{0, 1}, []int{2, 3})
			r.expectPages(0, 2, []int{0, 1}, []int{4, 5})
			r.expectZero(1, []int{4, 5, 6, 7})
		})
	}
}

// A chunk streaming per layer to two destinations, one of which fails its
// second group's batch: the chunk fails closed and names that group and
// destination, the first group landed on both destinations (their batches
// are accounted for separately), and the failed batch wrote nothing.
func TestOneDestinationFailsTheChunkClosed(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	var r *rig
	// Group 0's batches must be posted before group 1's fails, or the
	// failure cancels them (the chunk fails closed) and they rightly never
	// land. Layers of 25 ms used to order them, but a starved process sees
	// both groups' events complete at once, and the submitters post the
	// most urgent Work first, not the earliest group. So group 1's event
	// is recorded (LayerEnd(3), the stream's second event) only once group
	// 0's two batches were posted: group 1's Works do not exist before.
	// The wait is bounded, so that an engine that never posts group 0
	// fails the checks below rather than hangs.
	var group0 atomic.Int32
	group0Posted := make(chan struct{})
	r = newRig(t, rigOpts{geom: g, hooks: 4, group: 2, decodes: 2, layerTime: 25 * time.Millisecond,
		gpuFaults: func(e sim.EventInfo) sim.Fault {
			if e.Seq == 2 {
				select {
				case <-group0Posted:
				case <-time.After(5 * time.Second):
				}
			}
			return sim.NoFault
		},
		netFaults: func(b rdmafault.BatchInfo) rdmafault.Fault {
			dest := 0
			if b.To == "decode1" {
				dest = 1
			}
			if b.Dst < r.decodes[dest].Bases[2] { // group 0: buffers 0-1
				if group0.Add(1) == 2 {
					close(group0Posted)
				}
			} else if dest == 1 { // group 1: buffers 2-3
				return rdmafault.Fault{Kind: rdmafault.FailCompletion}
			}
			return rdmafault.Fault{Kind: rdmafault.DelayCompletion, Delay: 5 * time.Millisecond}
		}})
	reg := r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2,
		infos: []system.DecodeInfo{{Peer: "d0", DstPages: []int{0, 1}}, {Peer: "d1", DstPages: []int{2, 3}}}})
	require.Equal(t, system.PerLayer, reg.Mode)
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	res, err := r.eng.Finish(context.Background(), 1)
	require.Error(t, err)
	assert.Equal(t, system.Failed, res.Status)
	assert.Contains(t, err.Error(), "group 1 to destination 1: batch failed")
	want := make([]byte, g.ItemLen)
	for b := 0; b < 4; b++ {
		for pos := 0; pos < 2; pos++ {
			testbed.Fill(want, 99, 1, b, pos)
			if b < 2 {
				assert.Equal(t, want, r.decodes[0].Page(b, pos), "destination 0 buffer %d position %d", b, pos)
				assert.Equal(t, want, r.decodes[1].Page(b, 2+pos), "destination 1 buffer %d position %d", b, pos)
			} else {
				assert.Equal(t, make([]byte, g.ItemLen), r.decodes[1].Page(b, 2+pos), "the failed batch wrote nothing")
			}
		}
	}
	_, err = r.eng.Finish(context.Background(), 1)
	require.True(t, errors.Is(err, system.ErrNoChunk), "the failed chunk was finished once")
}

// "timeout → FAILED within the timeout": an event that never completes.
func TestTimeoutFailsWithinTimeout(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	const timeout = 300 * time.Millisecond
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, timeout: timeout,
		gpuFaults: func(e sim.EventInfo) sim.Fault {
			if e.Seq == 1 {
				return sim.NeverComplete
			}
			return sim.NoFault
		}})
	// A starved process cannot fire a timer sooner than it runs again: the
	// probe says how long it could not run, the reliability suite's rule.
	probe := stallprobe.Start()
	defer probe.Close()
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	start := time.Now()
	res, err := r.eng.Finish(context.Background(), 1)
	elapsed := time.Since(start)
	require.Error(t, err)
	assert.True(t, errors.Is(err, system.ErrTimeout), "%v", err)
	assert.Equal(t, system.Failed, res.Status)
	// The chunk gives up a tenth before the timeout to tear down within it.
	assert.GreaterOrEqual(t, elapsed, timeout-actors.TeardownReserve(timeout))
	// Finish returns within its timeout plus 100 ms of scheduling, unless
	// the process was stalled for at least the overrun.
	if over := elapsed - (timeout + 100*time.Millisecond); over > 0 {
		st := probe.Stalled(start, start.Add(elapsed))
		assert.GreaterOrEqual(t, st, over, "Finish returned %v after its call, past its timeout by more than the process was stalled (%v)", elapsed, st)
	}
	// The engine keeps serving: room 2 succeeds, unless its own 300 ms ran
	// out while the process was stalled for a quarter of them or more.
	r.register(chunk{room: 2, end: 8, last: true, src: []int{2, 3}, total: 2, infos: oneInfo("d0", []int{2, 3})})
	r.forward(testbed.Write{Room: 2, SrcPages: []int{2, 3}, Tokens: 8})
	start = time.Now()
	res, err = r.eng.Finish(context.Background(), 2)
	if errors.Is(err, system.ErrTimeout) {
		if st := probe.Stalled(start, time.Now()); st >= timeout/4 {
			t.Logf("room 2 timed out while the process was stalled %v: starvation, not a fault: %v", st, err)
			return
		}
	}
	require.NoError(t, err)
	require.Equal(t, system.Succeeded, res.Status)
	r.expectPages(0, 2, []int{0, 1}, []int{2, 3})
}

// "submit failure stops and reports failure".
func TestSubmitFailureReportsFailure(t *testing.T) {
	g := testbed.MLA(8, 16, 64)
	r := newRig(t, rigOpts{geom: g, hooks: 8, group: 2,
		netFaults: func(b rdmafault.BatchInfo) rdmafault.Fault {
			if b.Seq == 2 {
				return rdmafault.Fault{Kind: rdmafault.PostError}
			}
			return rdmafault.Fault{}
		}})
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	res, err := r.eng.Finish(context.Background(), 1)
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdmafault.ErrInjected), "%v", err)
	assert.Equal(t, system.Failed, res.Status)
	assert.ErrorContains(t, err, "room 1 chunk 0")
}

// "wait failure propagates".
func TestWaitFailurePropagates(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 4,
		gpuFaults: func(e sim.EventInfo) sim.Fault {
			if e.Seq == 1 {
				return sim.WaitError
			}
			return sim.NoFault
		}})
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	res, err := r.eng.Finish(context.Background(), 1)
	require.Error(t, err)
	assert.True(t, errors.Is(err, system.ErrEventWait), "%v", err)
	assert.Equal(t, system.Failed, res.Status)
	r.expectZero(0, []int{0, 1})
}

// Invariant 12: a successful finish logs nothing above DEBUG; a failure logs
// one WARN with room, chunk and cause.
func TestQuietSuccessLoudFailure(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	g := testbed.MLA(4, 16, 64)
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, log: zap.New(core),
		netFaults: func(b rdmafault.BatchInfo) rdmafault.Fault {
			if b.Seq == 3 {
				return rdmafault.Fault{Kind: rdmafault.FailCompletion}
			}
			return rdmafault.Fault{}
		}})
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8}) // batches 1, 2
	r.finish(1)
	for _, e := range logs.All() {
		assert.Equal(t, zapcore.DebugLevel, e.Level, "success logged %q at %v", e.Message, e.Level)
	}
	require.NotEmpty(t, logs.FilterMessage("chunk transfer done").All(), "success is visible at DEBUG")

	r.register(chunk{room: 2, end: 8, last: true, src: []int{2, 3}, total: 2, infos: oneInfo("d0", []int{2, 3})})
	r.forward(testbed.Write{Room: 2, SrcPages: []int{2, 3}, Tokens: 8}) // batch 3 fails
	_, err := r.eng.Finish(context.Background(), 2)
	require.Error(t, err)
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	require.Len(t, warns, 1)
	fields := warns[0].ContextMap()
	assert.Equal(t, uint64(2), fields["room"])
	assert.Equal(t, int64(0), fields["chunk"])
	assert.Contains(t, fields["error"], "injected completion error")
}
