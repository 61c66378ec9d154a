package tests

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/lab/stallprobe"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// The reliability suite: long-lived engines serve thousands of small
// randomized scenarios with faults injected in the virtual GPU (events that
// never complete, fail their wait or fail to record) and in the loopback
// transport (post errors, failed, lost or late completions, a connection
// broken in the middle of a batch, a slow link, a decode peer that
// vanishes), plus drops in the middle of a forward. For every chunk it
// asserts: Finish returned within its timeout; the status is FAILED exactly
// when a failing fault touched the chunk (directly, or through the teardown
// another chunk's timeout caused or a vanished peer), and a broken
// connection or a lost completion alone is resumed (the chunk re-sends what
// did not land, or was not confirmed, and succeeds);
// successful chunks are byte-equal; nothing landed on a chunk's pages after
// its Finish or Drop returned. goleak (TestMain) checks that Close leaves no
// goroutine, and every engine keeps serving new rooms after its restarts.

const (
	relEngines   = 4
	relScenarios = 300 // per engine
	relTimeout   = 250 * time.Millisecond
	relHangSlack = time.Second
	relLayers    = 6 // buffers; hooks are relLayers-1 (one MTP-like layer)
	relGroup     = 2
	relPageSize  = 4
	relItemLen   = 32
	relMaxPages  = 6 // per request
	relWindow    = 24
	relPoolPages = relWindow * relScenarios
	relSrcPages  = 64
)

// Fault kinds of the suite, as counted in the summary.
const (
	fPostError    = "post_error"
	fFailDone     = "fail_completion"
	fLoseDone     = "lose_completion"
	fDelayShort   = "delay_completion_short"
	fDelayLong    = "delay_completion_long"
	fBrokenEP     = "endpoint_broken"
	fSlowLink     = "slow_link"
	fNeverDone    = "event_never_completes"
	fWaitError    = "event_wait_error"
	fRecordError  = "event_record_error"
	fPeerVanishes = "peer_vanishes"
	fDropMid      = "drop_mid_forward"
)

// failing says whether a fault must fail the chunks it touches (delays
// within the timeout and a slow link must not, nor a broken connection: the
// chunk resumes on a fresh endpoint; nor a completion lost or delayed past
// the chunk's completion deadline: it resumes the same way).
var failing = map[string]bool{
	fPostError: true, fFailDone: true,
	fNeverDone: true, fWaitError: true, fRecordError: true, fPeerVanishes: true,
}

// overdueKind says whether a fault withholds a batch's completion past the
// chunk's completion deadline (actors.CompletionDeadline): resumed like a
// broken connection.
func overdueKind(k string) bool { return k == fLoseDone || k == fDelayLong }

type relStats struct {
	mu                                      sync.Mutex
	scenarios, chunks, failed, dropped      int
	faults                                  map[string]int
	restarts                                int64
	hangs, lateWrites, corrupt, unexplained int
	missedFailures                          int
	resent, resumed                         int // Works re-sent; chunks that succeeded after re-sending
	// overdue counts the batches written off at their completion
	// deadline; lostResumed the chunks touched by a lost or long-delayed
	// completion that succeeded after one.
	overdue, lostResumed int
	// starved counts chunks that failed by their timeout, touched by no
	// fault, while the process was stalled for a quarter of their time or
	// more; starvedHangs Finishes past their bound by no more than the
	// process was stalled. The machine's, not the engine's: counted and
	// shown, never hidden.
	starved, starvedHangs int
	problems              []string
}

func (s *relStats) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.problems) < 20 {
		s.problems = append(s.problems, fmt.Sprintf(format, args...))
	}
}

// faultStream wraps the compute stream: an armed fault applies to the next
// recorded event.
type faultStream struct {
	*sim.Stream
	mu    sync.Mutex
	armed string
	fired bool
}

// inject arms kind for the records call makes, and reports whether one
// consumed it (an idle forward records nothing).
func (s *faultStream) inject(kind string, call func()) bool {
	s.mu.Lock()
	s.armed, s.fired = kind, false
	s.mu.Unlock()
	call()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = ""
	return s.fired
}

func (s *faultStream) Record() (cuda.Event, error) {
	s.mu.Lock()
	kind := s.armed
	s.armed = ""
	if kind != "" {
		s.fired = true
	}
	s.mu.Unlock()
	switch kind {
	case fRecordError:
		return nil, errors.New("injected: record event failed")
	case fNeverDone:
		return neverEvent{}, nil
	}
	ev, err := s.Stream.Record()
	if kind == fWaitError && err == nil {
		return failingEvent{ev}, nil
	}
	return ev, err
}

type neverEvent struct{}

func (neverEvent) Query() (bool, error) { return false, nil }
func (neverEvent) Wait(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

type failingEvent struct{ cuda.Event }

func (e failingEvent) Wait(ctx context.Context) error {
	if err := e.Event.Wait(ctx); err != nil {
		return err
	}
	return errors.New("injected: event wait failed")
}

// relPeer is a decode session of the suite.
type relPeer struct {
	id   string
	tr   *loopback.Transport
	pool *testbed.Decode
	dead bool
}

// relRoom is one request of a scenario.
type relRoom struct {
	room     uint64
	tokens   int
	chunks   []int // token ends
	dummy    bool  // all destinations dummy
	src, dst []int // per position
	dropAt   int   // forward index to drop in (-1: never), after layer dropLayer
	dropLyr  int
	// ranges, owned and positions are, per chunk, its pages, how many of
	// them this CP rank sends and their positions: computed once, when the
	// room is drawn.
	ranges    []cp.Range
	owned     []int
	positions [][]int
	results   []system.Result
	returns   []time.Time
	// registered is when each chunk's registration began: with its
	// return, the interval the stall probe is asked about.
	registered []time.Time
	mode       system.Mode
	window     int // first decode page of the room
	peerRefs   []*relPeer
}

// chunkRef is chunk k of a room (forward k of its scenario writes it).
type chunkRef struct {
	room uint64
	k    int
}

// batchFault is a planned transport fault: the n-th batch to the room.
type batchFault struct {
	room uint64
	nth  int
	kind string
}

type relEngine struct {
	t      *testing.T
	probe  *stallprobe.Probe
	rng    *rand.Rand
	stats  *relStats
	fab    *loopback.Fabric
	pre    rdma.Transport // the loopback node, behind the fault wrapper
	gpu    *sim.GPU
	stream *faultStream
	pool   *testbed.Pool
	geom   testbed.Geometry
	eng    *system.Engine
	cp     cp.CP
	peers  []*relPeer

	mu       sync.Mutex
	planned  []batchFault
	seen     map[uint64]int // batches per room in this scenario
	fired    map[chunkRef][]string
	current  int                          // the forward in progress: batches now belong to its chunks
	pageRoom map[string]map[uint64]uint64 // node -> page -> room (pages are never reused)
	landings []loopback.Landing           // not yet checked
	slowNext map[slowKey]time.Duration    // slow-link faults decided, for the loopback to apply
	returned map[uint64]time.Time         // room -> its last Finish/Drop return
}

func newRelEngine(t *testing.T, seed uint64, stats *relStats, probe *stallprobe.Probe) *relEngine {
	r := &relEngine{t: t, probe: probe, rng: rand.New(rand.NewPCG(seed, 99)), stats: stats, seen: map[uint64]int{}, fired: map[chunkRef][]string{},
		pageRoom: map[string]map[uint64]uint64{}, returned: map[uint64]time.Time{}, slowNext: map[slowKey]time.Duration{}}
	r.cp = cp.CP{Size: 1 + int(seed%2), Rule: cp.Rule(seed % 2)}
	r.cp.Rank = int(seed/2) % r.cp.Size
	r.fab = loopback.NewFabric(loopback.Options{Slow: r.slow, OnLand: r.land})
	lb, err := r.fab.NewTransport("prefill")
	require.NoError(t, err)
	r.pre = rdmafault.Wrap(lb, r.fault)
	t.Cleanup(func() { _ = r.pre.Close() })
	r.geom = testbed.MLA(relLayers, relItemLen, relPoolPages)
	r.pool, err = testbed.NewPool(testbed.MLA(relLayers, relItemLen, relSrcPages))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.pool.Free() })
	r.gpu = sim.New(sim.Options{})
	t.Cleanup(r.gpu.Close)
	r.stream = &faultStream{Stream: r.gpu.NewStream("compute")}
	r.eng, err = system.New(system.Config{
		Buffers: r.pool.EngineBuffers(), HookLayers: relLayers - 1, GroupSize: relGroup, PageSize: relPageSize, CP: r.cp,
		FinishTimeout: relTimeout, MaxRestarts: 1000,
	}, system.WithStream(r.stream), system.WithTransport(r.pre), system.WithLogger(zap.NewNop()),
		system.WithGetenv(func(string) string { return "" }))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.eng.Close() })
	for i := 0; i < 2; i++ {
		r.addPeer()
	}
	return r
}

var peerSerial atomic.Int64

func (r *relEngine) addPeer() *relPeer {
	id := fmt.Sprintf("decode%d", peerSerial.Add(1))
	tr, err := r.fab.NewTransport(id)
	require.NoError(r.t, err)
	d, err := testbed.NewDecode(tr, r.geom)
	require.NoError(r.t, err)
	p := &relPeer{id: id, tr: tr, pool: d}
	r.t.Cleanup(func() { _ = tr.Close(); _ = d.Free() })
	require.NoError(r.t, r.eng.AddPeer(d.Peer(id)))
	r.peers = append(r.peers, p)
	return p
}

func (r *relEngine) livePeers() []*relPeer {
	var out []*relPeer
	for _, p := range r.peers {
		if !p.dead {
			out = append(out, p)
		}
	}
	return out
}

// fault is the fault wrapper's hook: it maps a batch to its room by the
// destination page and applies the scenario's plan. A slow link is the
// loopback's to model: fault leaves it to slow, which the same Post calls
// next.
func (r *relEngine) fault(b rdmafault.BatchInfo) rdmafault.Fault {
	r.mu.Lock()
	defer r.mu.Unlock()
	room, ok := r.roomOf(b.To, b.Dst)
	if !ok {
		return rdmafault.Fault{}
	}
	n := r.seen[room]
	r.seen[room]++
	for _, f := range r.planned {
		if f.room != room || f.nth != n {
			continue
		}
		ref := chunkRef{room, r.current}
		r.fired[ref] = append(r.fired[ref], f.kind)
		switch f.kind {
		case fPostError:
			return rdmafault.Fault{Kind: rdmafault.PostError}
		case fFailDone:
			return rdmafault.Fault{Kind: rdmafault.FailCompletion}
		case fLoseDone:
			return rdmafault.Fault{Kind: rdmafault.LoseCompletion}
		case fDelayShort:
			return rdmafault.Fault{Kind: rdmafault.DelayCompletion, Delay: 5 * time.Millisecond}
		case fDelayLong:
			// Later than any Finish of the scenario can wait (Finishes run one
			// after the other, each bounded by the timeout).
			return rdmafault.Fault{Kind: rdmafault.DelayCompletion, Delay: 20 * relTimeout}
		case fBrokenEP:
			return rdmafault.Fault{Kind: rdmafault.BreakEndpoint}
		case fSlowLink:
			r.slowNext[slowKey{b.To, b.Dst}] = 5 * time.Millisecond
			return rdmafault.Fault{}
		}
	}
	return rdmafault.Fault{}
}

// slowKey names a batch in both hooks: its destination node and first
// destination address (no two batches in flight share them).
type slowKey struct {
	node string
	dst  uint64
}

// slow is the loopback's hook: it applies the slow link fault decided for
// the batch.
func (r *relEngine) slow(b loopback.BatchInfo) loopback.Slowdown {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := slowKey{b.To, b.Dst}
	d, ok := r.slowNext[k]
	if !ok {
		return loopback.Slowdown{}
	}
	delete(r.slowNext, k)
	return loopback.Slowdown{Hold: d}
}

func (r *relEngine) roomOf(node string, addr uint64) (uint64, bool) {
	for _, p := range r.peers {
		if p.id != node {
			continue
		}
		per := uint64(relItemLen * relPoolPages)
		off := addr - p.pool.Bases[0]
		page := (off % per) / relItemLen
		room, ok := r.pageRoom[node][page]
		return room, ok
	}
	return 0, false
}

func (r *relEngine) land(l loopback.Landing) {
	r.mu.Lock()
	r.landings = append(r.landings, l)
	r.mu.Unlock()
}

// relScenario is one drawn scenario: its rooms and the faults planned for
// it (the transport's are in relEngine.planned, where its hook finds them).
type relScenario struct {
	n          int
	rooms      []*relRoom
	forwards   int
	eventFault map[[2]int]string // (forward, boundary index; -1 = end) -> kind
	vanishPeer *relPeer          // the decode peer that vanishes, if any,
	vanishAt   int               // before this forward
}

// relOutcome is what running a scenario showed beyond the rooms' results.
type relOutcome struct {
	touched         map[chunkRef][]string // the faults that touched each chunk
	timeoutHappened bool                  // a Finish or Drop timed out and tore endpoints down
	aborted         bool                  // a registration failed: nothing to check
}

// scenario draws, runs and checks one scenario. A clean scenario injects
// nothing.
func (r *relEngine) scenario(n int, clean bool) []*relRoom {
	sc := r.draw(n, clean)
	out := r.run(sc)
	if !out.aborted {
		r.check(sc, out)
	}
	return sc.rooms
}

// draw generates scenario n: its rooms, then its faults.
func (r *relEngine) draw(n int, clean bool) *relScenario {
	sc := &relScenario{n: n, rooms: r.drawRooms(n), eventFault: map[[2]int]string{}, vanishAt: -1}
	for _, rm := range sc.rooms {
		sc.forwards = max(sc.forwards, len(rm.chunks))
	}
	if !clean {
		r.drawFaults(sc)
	}
	return sc
}

// drawRooms draws 1 to 3 rooms of 1 or 2 chunks on the live peers (or on
// dummy destinations), each on decode pages no earlier scenario used.
func (r *relEngine) drawRooms(n int) []*relRoom {
	rng := r.rng
	live := r.livePeers()
	rooms := make([]*relRoom, 1+rng.IntN(3))
	r.mu.Lock()
	r.planned, r.seen, r.fired = nil, map[uint64]int{}, map[chunkRef][]string{}
	r.mu.Unlock()
	srcPerm := rng.Perm(relSrcPages) // rooms of a scenario write distinct prefill pages
	window := (n % relScenarios) * relWindow
	for i := range rooms {
		tokens := 1 + rng.IntN(relMaxPages*relPageSize)
		rm := &relRoom{room: uint64(n*10 + i), tokens: tokens, dropAt: -1}
		pages := (tokens + relPageSize - 1) / relPageSize
		if rng.IntN(3) == 0 && tokens > relPageSize {
			mid := relPageSize * (1 + rng.IntN((tokens-1)/relPageSize))
			rm.chunks = []int{mid, tokens}
		} else {
			rm.chunks = []int{tokens}
		}
		switch x := rng.IntN(10); {
		case x == 0:
			rm.dummy = true
		case x == 1 && len(live) > 1:
			rm.peerRefs = []*relPeer{live[0], live[1]}
		default:
			rm.peerRefs = []*relPeer{live[rng.IntN(len(live))]}
		}
		rm.src = srcPerm[i*relMaxPages : i*relMaxPages+pages]
		rm.window = window + i*relMaxPages
		rm.dst = make([]int, pages)
		for x := range rm.dst {
			rm.dst[x] = rm.window + x
		}
		for k, end := range rm.chunks {
			start := 0
			if k > 0 {
				start = rm.chunks[k-1]
			}
			rg, err := cp.ChunkRange(start, end, relPageSize, k == len(rm.chunks)-1)
			require.NoError(r.t, err)
			owned, pos, err := r.cp.Owned(rm.src[rg.PageStart:rg.PageStart+rg.Pages], rg.PageStart, len(rm.src))
			require.NoError(r.t, err)
			rm.ranges, rm.owned, rm.positions = append(rm.ranges, rg), append(rm.owned, len(owned)), append(rm.positions, pos)
		}
		r.mu.Lock()
		for _, p := range rm.peerRefs {
			if r.pageRoom[p.id] == nil {
				r.pageRoom[p.id] = map[uint64]uint64{}
			}
			for _, d := range rm.dst {
				r.pageRoom[p.id][uint64(d)] = rm.room
			}
		}
		r.mu.Unlock()
		rooms[i] = rm
	}
	return rooms
}

// drawFaults plans none in about a third of the scenarios, else one or two:
// event faults, drops and a vanishing peer in sc, transport faults in
// r.planned, where the fault hook finds them.
func (r *relEngine) drawFaults(sc *relScenario) {
	rng := r.rng
	if rng.IntN(3) > 0 {
		for k := 1 + rng.IntN(2); k > 0; k-- {
			kinds := []string{fPostError, fFailDone, fLoseDone, fDelayShort, fDelayLong, fBrokenEP, fSlowLink,
				fNeverDone, fWaitError, fRecordError, fDropMid, fPeerVanishes}
			kind := kinds[rng.IntN(len(kinds))]
			rm := sc.rooms[rng.IntN(len(sc.rooms))]
			switch kind {
			case fNeverDone, fWaitError, fRecordError:
				boundaries := (relLayers - 1 + relGroup - 1) / relGroup
				sc.eventFault[[2]int{rng.IntN(sc.forwards), rng.IntN(boundaries+1) - 1}] = kind
			case fDropMid:
				rm.dropAt, rm.dropLyr = rng.IntN(len(rm.chunks)), rng.IntN(relLayers)
			case fPeerVanishes:
				if sc.vanishPeer == nil && len(rm.peerRefs) > 0 && rng.IntN(4) == 0 { // rare: it costs a peer
					sc.vanishPeer, sc.vanishAt = rm.peerRefs[0], rng.IntN(sc.forwards)
				} else {
					continue
				}
			default:
				r.mu.Lock()
				r.planned = append(r.planned, batchFault{room: rm.room, nth: rng.IntN(4), kind: kind})
				r.mu.Unlock()
			}
		}
	}
}

// run drives the scenario's forwards through the engine, injecting its
// event faults, drops and vanishing peer, and records which chunks each
// fault touched.
func (r *relEngine) run(sc *relScenario) *relOutcome {
	out := &relOutcome{touched: map[chunkRef][]string{}}
	for k := 0; k < sc.forwards; k++ {
		if !r.runForward(sc, k, out) {
			return &relOutcome{aborted: true}
		}
	}
	if sc.vanishPeer != nil {
		r.addPeer() // the engine keeps serving: later scenarios use a fresh decode session
	}
	return out
}

// runForward runs forward k of the scenario: the vanishing peer goes
// before it if planned, its chunks are registered, the forward runs with its
// event faults and drops, and its chunks are finished. It records in out
// which faults touched which chunk, and reports false if a registration
// failed.
func (r *relEngine) runForward(sc *relScenario, k int, out *relOutcome) bool {
	r.mu.Lock()
	r.current = k
	r.mu.Unlock()
	if k == sc.vanishAt && sc.vanishPeer != nil {
		sc.vanishPeer.dead = true
		_ = sc.vanishPeer.tr.Close() // the decode process is gone: connects and posts fail
		r.count(fPeerVanishes)
	}
	writes, inFwd, ok := r.registerForward(sc, k)
	if !ok {
		return false
	}
	needEvents := r.driveForward(sc, k, writes, inFwd, out)
	r.attribute(sc, k, inFwd, needEvents, out)
	r.finishForward(sc, k, inFwd, out)
	return true
}

// registerForward registers the chunk of every room that forward k writes
// and returns the forward's writes and rooms.
func (r *relEngine) registerForward(sc *relScenario, k int) (writes []testbed.Write, inFwd []*relRoom, ok bool) {
	n, rooms, ctx := sc.n, sc.rooms, context.Background()
	for _, rm := range rooms {
		if k >= len(rm.chunks) || (rm.dropAt >= 0 && k > rm.dropAt) {
			continue
		}
		start := 0
		if k > 0 {
			start = rm.chunks[k-1]
		}
		last := k == len(rm.chunks)-1
		rg := rm.ranges[k]
		spec := system.ChunkSpec{Room: rm.room, Start: start, End: rm.chunks[k], Last: last,
			SrcPages: rm.src[rg.PageStart : rg.PageStart+rg.Pages], TotalPages: len(rm.src)}
		if rm.dummy {
			spec.Infos = []system.DecodeInfo{{Peer: "x", Dummy: true}}
		}
		for _, p := range rm.peerRefs {
			spec.Infos = append(spec.Infos, system.DecodeInfo{Peer: p.id, DstPages: rm.dst})
		}
		rm.registered = append(rm.registered, time.Now())
		reg, err := r.eng.Register(ctx, spec)
		if err != nil {
			r.stats.problem("scenario %d: register room %d: %v", n, rm.room, err)
			r.t.Errorf("scenario %d: register room %d: %v", n, rm.room, err)
			return nil, nil, false
		}
		rm.mode = reg.Mode
		writes = append(writes, testbed.Write{Room: rm.room, PageStart: rg.PageStart, SrcPages: spec.SrcPages, Tokens: rg.End - rg.Start})
		inFwd = append(inFwd, rm)
	}
	return writes, inFwd, true
}

// driveForward launches forward k's layers on the virtual GPU, ends its
// layers (injecting the planned event faults) and drops rooms in the middle
// of it; it returns the event faults that fired ("g<group>:<kind>" or
// "end:<kind>").
func (r *relEngine) driveForward(sc *relScenario, k int, writes []testbed.Write, inFwd []*relRoom, out *relOutcome) []string {
	eventFault, ctx := sc.eventFault, context.Background()
	fw, err := r.eng.BeginForward()
	require.NoError(r.t, err)
	var needEvents []string
	for l := 0; l < relLayers; l++ {
		require.NoError(r.t, r.stream.Launch(sim.Kernel{Duration: time.Duration(r.rng.IntN(150)) * time.Microsecond, Run: layerWriter(r.pool, l, writes)}))
		if l < relLayers-1 {
			if (l+1)%relGroup == 0 || l == relLayers-2 {
				g := l / relGroup
				if kind, ok := eventFault[[2]int{k, g}]; ok {
					if r.stream.inject(kind, func() { _ = fw.LayerEnd(l) }) {
						r.count(kind)
						needEvents = append(needEvents, fmt.Sprintf("g%d:%s", g, kind))
					}
				} else {
					require.NoError(r.t, fw.LayerEnd(l))
				}
			} else {
				require.NoError(r.t, fw.LayerEnd(l))
			}
		}
		for _, rm := range inFwd {
			if rm.dropAt == k && rm.dropLyr == l {
				start := time.Now()
				err := r.eng.Drop(ctx, rm.room)
				took := time.Since(start)
				if took >= relTimeout {
					out.timeoutHappened = true // the drop timed out and tore endpoints down
				}
				rm.returns = append(rm.returns, time.Now())
				rm.results = append(rm.results, system.Result{Status: system.Dropped, Err: err})
				r.count(fDropMid)
				// A Drop returns nil once the room's writes stopped: the
				// loopback's teardown always stops them. An error (the
				// engine gave up waiting, ErrNotQuiesced) is excused only
				// as an overrun is, by a stall at least as long.
				r.withinBound(sc.n, rm.room, "Drop", start, took)
				if err != nil && !r.excused(start, took) {
					r.stats.mu.Lock()
					r.stats.unexplained++
					r.stats.mu.Unlock()
					r.stats.problem("scenario %d room %d: Drop failed after %v: %v", sc.n, rm.room, took, err)
				}
			}
		}
	}
	if kind, ok := eventFault[[2]int{k, -1}]; ok {
		if r.stream.inject(kind, func() { _ = fw.End() }) {
			r.count(kind)
			needEvents = append(needEvents, "end:"+kind)
		}
	} else {
		require.NoError(r.t, fw.End())
	}
	return needEvents
}

// attribute records which chunks of forward k the fired event faults and a
// vanished peer touched.
func (r *relEngine) attribute(sc *relScenario, k int, inFwd []*relRoom, needEvents []string, out *relOutcome) {
	for _, rm := range inFwd {
		if rm.dropAt == k {
			continue
		}
		owned := rm.owned[k]
		for _, ev := range needEvents {
			kind := ev[strings.Index(ev, ":")+1:]
			group := strings.HasPrefix(ev, "g")
			sends := owned > 0 && len(rm.peerRefs) > 0
			if (group && rm.mode == system.PerLayer && sends) || (!group && sends) {
				out.touched[chunkRef{rm.room, k}] = append(out.touched[chunkRef{rm.room, k}], kind)
			}
		}
		if sc.vanishPeer != nil && k >= sc.vanishAt && owned > 0 {
			for _, p := range rm.peerRefs {
				if p == sc.vanishPeer {
					out.touched[chunkRef{rm.room, k}] = append(out.touched[chunkRef{rm.room, k}], fPeerVanishes)
				}
			}
		}
	}
}

// finishForward finishes forward k's chunks one after the other and counts
// a Finish that overran its timeout as a hang.
func (r *relEngine) finishForward(sc *relScenario, k int, inFwd []*relRoom, out *relOutcome) {
	n, ctx := sc.n, context.Background()
	for _, rm := range inFwd {
		if rm.dropAt == k {
			continue
		}
		start := time.Now()
		res, err := r.eng.Finish(ctx, rm.room)
		took := time.Since(start)
		rm.returns = append(rm.returns, time.Now())
		if err != nil && res.Chunk.Serial == 0 {
			r.t.Errorf("scenario %d: finish room %d: %v", n, rm.room, err)
		}
		rm.results = append(rm.results, res)
		r.withinBound(n, rm.room, "Finish", start, took)
		if errors.Is(err, system.ErrTimeout) {
			out.timeoutHappened = true
		}
	}
}

// withinBound counts a call on room (a Finish, a Drop) that took longer
// than its timeout and the slack as a hang, unless this process was
// stalled (starved of CPU) for at least the overrun: its timer could not
// fire any sooner than the process ran (then it counts it as such). It
// reports whether the call kept its bound.
func (r *relEngine) withinBound(n int, room uint64, call string, start time.Time, took time.Duration) bool {
	over := took - (relTimeout + relHangSlack)
	if over <= 0 {
		return true
	}
	st := r.probe.Stalled(start, start.Add(took))
	r.stats.mu.Lock()
	defer r.stats.mu.Unlock()
	if st >= over {
		r.stats.starvedHangs++
		return false
	}
	r.stats.hangs++
	if len(r.stats.problems) < 20 {
		r.stats.problems = append(r.stats.problems, fmt.Sprintf("scenario %d room %d: %s took %v (the process was stalled %v of it)", n, room, call, took, st))
	}
	return false
}

// excused reports whether a call that took took from start overran its
// bound while this process was stalled for at least the overrun.
func (r *relEngine) excused(start time.Time, took time.Duration) bool {
	over := took - (relTimeout + relHangSlack)
	return over > 0 && r.probe.Stalled(start, start.Add(took)) >= over
}

func describe(touched map[chunkRef][]string) string {
	var out []string
	for ref, kinds := range touched {
		out = append(out, fmt.Sprintf("room %d chunk %d: %v", ref.room, ref.k, kinds))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

func (r *relEngine) count(kind string) {
	r.stats.mu.Lock()
	r.stats.faults[kind]++
	r.stats.mu.Unlock()
}

func layerWriter(pool *testbed.Pool, l int, writes []testbed.Write) func() {
	return func() {
		for _, w := range writes {
			for i, sp := range w.SrcPages {
				testbed.Fill(pool.Page(l, sp), 7, w.Room, l, w.PageStart+i)
			}
		}
	}
}

// check applies the suite's assertions to a scenario that ran.
func (r *relEngine) check(sc *relScenario, out *relOutcome) {
	n, rooms, touched, timeoutHappened := sc.n, sc.rooms, out.touched, out.timeoutHappened
	var firedKinds []string
	r.mu.Lock()
	for ref, kinds := range r.fired {
		touched[ref] = append(touched[ref], kinds...)
		firedKinds = append(firedKinds, kinds...)
	}
	for _, rm := range rooms {
		if len(rm.returns) > 0 {
			r.returned[rm.room] = rm.returns[len(rm.returns)-1]
		}
	}
	r.mu.Unlock()
	r.checkLanded(n)
	st := r.stats
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, k := range firedKinds {
		st.faults[k]++
	}
	st.scenarios++
	endpointBroke, connBroke := false, false
	for _, kinds := range touched {
		for _, k := range kinds {
			endpointBroke = endpointBroke || k == fPeerVanishes
			connBroke = connBroke || k == fBrokenEP
		}
	}
	for _, rm := range rooms {
		for i, res := range rm.results {
			mustFail := false
			for _, k := range touched[chunkRef{rm.room, i}] {
				mustFail = mustFail || failing[k]
			}
			st.chunks++
			st.resent += res.Stats.Resent
			st.overdue += res.Stats.Overdue
			if res.Stats.Resent > 0 && res.Status == messages.Succeeded {
				st.resumed++
				if res.Stats.Overdue > 0 && slices.ContainsFunc(touched[chunkRef{rm.room, i}], overdueKind) {
					st.lostResumed++
				}
			}
			switch res.Status {
			case messages.Dropped:
				st.dropped++
				if rm.dropAt < 0 {
					st.unexplained++
					st.problems = append(st.problems, fmt.Sprintf("scenario %d room %d: DROPPED without a drop", n, rm.room))
				}
			case messages.Failed:
				st.failed++
				// A teardown (after a timeout) or a vanished peer fails every
				// batch in flight on that endpoint, whichever chunk posted it.
				// A broken connection does not: those batches resume.
				collateral := (timeoutHappened || endpointBroke) && errors.Is(res.Err, rdma.ErrEndpointBroken)
				var stalled time.Duration
				if i < len(rm.registered) && i < len(rm.returns) {
					stalled = r.probe.Stalled(rm.registered[i], rm.returns[i])
				}
				switch explainFailure(mustFail, collateral, errors.Is(res.Err, system.ErrTimeout), stalled) {
				case starvedTimeout:
					st.starved++
					st.problems = append(st.problems, fmt.Sprintf("scenario %d room %d chunk %d: timed out while the process was stalled %v (starvation, not a fault): %v",
						n, rm.room, i, stalled.Round(time.Millisecond), res.Err))
				case unexplainedFailure:
					st.unexplained++
					st.problems = append(st.problems, fmt.Sprintf("scenario %d room %d chunk %d (mode %v, %d peers): FAILED without a fault: %v (the process was stalled %v of its time); scenario faults: %s",
						n, rm.room, i, rm.mode, len(rm.peerRefs), res.Err, stalled.Round(time.Millisecond), describe(touched)))
				}
			case messages.Succeeded:
				// A batch whose completion was lost or delayed, on an
				// endpoint that a broken connection's resume then closed,
				// fails as broken with it and is re-sent: the chunk
				// succeeds once the re-sent writes landed (its bytes are
				// checked below).
				resumedPast := connBroke && res.Stats.Resent > 0
				if mustFail && !resumedPast {
					st.missedFailures++
					st.problems = append(st.problems, fmt.Sprintf("scenario %d room %d chunk %d: SUCCESS although touched by %v (%d Works re-sent; a connection broke in the scenario: %v)",
						n, rm.room, i, touched[chunkRef{rm.room, i}], res.Stats.Resent, connBroke))
				}
				if !r.bytesEqual(rm, i) {
					st.corrupt++
					st.problems = append(st.problems, fmt.Sprintf("scenario %d room %d chunk %d: SUCCESS but bytes differ", n, rm.room, i))
				}
			}
		}
	}
}

// checkLanded checks every landing since the last check: nothing of a room
// may land after its last Finish/Drop returned (pages are never reused, so
// a straggler of an old scenario is still attributed to its room).
func (r *relEngine) checkLanded(n int) {
	r.mu.Lock()
	var late []string
	for _, l := range r.landings {
		room, ok := r.roomOf(l.Node, l.Addr)
		if !ok {
			continue
		}
		if end, done := r.returned[room]; done && l.At.After(end) {
			late = append(late, fmt.Sprintf("after scenario %d: room %d: a write landed %v after its last Finish/Drop returned", n, room, l.At.Sub(end)))
		}
	}
	r.landings = r.landings[:0]
	r.mu.Unlock()
	r.stats.mu.Lock()
	r.stats.lateWrites += len(late)
	r.stats.problems = append(r.stats.problems, late...)
	r.stats.mu.Unlock()
}

// bytesEqual checks chunk i of the room on every real destination.
func (r *relEngine) bytesEqual(rm *relRoom, i int) bool {
	pos := rm.positions[i]
	want := make([]byte, relItemLen)
	for _, p := range rm.peerRefs {
		for _, x := range pos {
			for b := 0; b < relLayers; b++ {
				testbed.Fill(want, 7, rm.room, b, x)
				if !bytes.Equal(want, p.pool.Page(b, rm.dst[x])) {
					return false
				}
			}
		}
	}
	return true
}

func TestReliability(t *testing.T) {
	if testing.Short() {
		t.Skip("reliability suite: skipped with -short")
	}
	stats := &relStats{faults: map[string]int{}}
	probe := stallprobe.Start()
	defer probe.Close()
	start := time.Now()
	t.Run("engines", func(t *testing.T) {
		for e := 0; e < relEngines; e++ {
			t.Run(fmt.Sprintf("engine%d", e), func(t *testing.T) {
				t.Parallel()
				r := newRelEngine(t, uint64(e+1), stats, probe)
				for n := 0; n < relScenarios-1; n++ {
					r.scenario(e*relScenarios+n, false)
				}
				// After every fault and restart the engine still serves new
				// rooms end to end.
				require.NoError(t, r.eng.Healthy())
				for _, rm := range r.scenario(e*relScenarios+relScenarios-1, true) {
					for _, res := range rm.results {
						require.Equal(t, system.Succeeded, res.Status, "clean room %d after %d scenarios: %v", rm.room, relScenarios-1, res.Err)
					}
				}
				// Stragglers: a write still landing now would be late.
				time.Sleep(2 * relTimeout)
				r.checkLanded(relScenarios)
				stats.mu.Lock()
				stats.restarts += r.eng.Stats().Restarts
				stats.mu.Unlock()
			})
		}
	})
	var kinds []string
	for k, v := range stats.faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(kinds)
	summary := fmt.Sprintf("reliability: %d scenarios, %d chunks (%d failed, %d dropped) in %v; faults injected: %s; restarts %d; resent %d, chunks resumed %d, batches overdue %d, chunks resumed after a lost completion %d; hangs %d; late writes %d; corrupt successes %d; unexplained failures %d; missed failures %d; timeouts while starved %d, overruns while starved %d",
		stats.scenarios, stats.chunks, stats.failed, stats.dropped, time.Since(start).Round(time.Second), strings.Join(kinds, " "),
		stats.restarts, stats.resent, stats.resumed, stats.overdue, stats.lostResumed, stats.hangs, stats.lateWrites, stats.corrupt, stats.unexplained, stats.missedFailures, stats.starved, stats.starvedHangs)
	fmt.Println(summary)
	for _, p := range stats.problems {
		t.Log(p)
	}
	require.Zero(t, stats.hangs, "hangs")
	require.Zero(t, stats.lateWrites, "late writes")
	require.Zero(t, stats.corrupt, "corrupt successes")
	require.Zero(t, stats.unexplained, "failures no fault explains")
	require.Zero(t, stats.missedFailures, "faults that did not fail their chunk")
	// Starvation excuses a timeout, not everything: past a few per cent of
	// the chunks the machine was too busy for this suite to judge the
	// engine, which is a failure to report, not a pass.
	require.LessOrEqual(t, stats.starved+stats.starvedHangs, stats.chunks/50,
		"the machine starved this process too often to judge the engine (timeouts %d, overruns %d, of %d chunks)", stats.starved, stats.starvedHangs, stats.chunks)
	require.GreaterOrEqual(t, stats.scenarios, relEngines*relScenarios)
	if stats.faults[fBrokenEP] > 0 {
		require.Positive(t, stats.resumed, "broken connections were injected, and no chunk resumed after one")
	}
	if stats.faults[fLoseDone]+stats.faults[fDelayLong] > 0 {
		require.Positive(t, stats.lostResumed, "lost completions were injected, and no chunk resumed after one")
	}
}

// Outcomes of a failed chunk the oracle weighs.
const (
	explainedFailure   = iota // touched by a failing fault, or collateral of one
	starvedTimeout            // its timeout, no fault, the process stalled for a quarter of its time or more
	unexplainedFailure        // a defect
)

// starvedShare is the part of a chunk's time the process must have spent
// stalled for its timeout to be the machine's: a quarter of the finish
// timeout (the work of a chunk of the suite takes well under a tenth of
// it on a process that runs).
const starvedShare = relTimeout / 4

// explainFailure classifies a FAILED chunk: a fault explains it; else a
// timeout while the process was stalled at least starvedShare is
// starvation; anything else is a defect. A non-timeout error is never
// excused by starvation: only a deadline can be missed for want of CPU.
func explainFailure(mustFail, collateral, timedOut bool, stalled time.Duration) int {
	switch {
	case mustFail || collateral:
		return explainedFailure
	case timedOut && stalled >= starvedShare:
		return starvedTimeout
	}
	return unexplainedFailure
}

// TestReliabilityOracleOnStarvation: the oracle excuses a timeout only
// when the process was measurably stalled, never another error, and never
// a timeout of a process that ran.
func TestReliabilityOracleOnStarvation(t *testing.T) {
	require.Equal(t, explainedFailure, explainFailure(true, false, true, 0))
	require.Equal(t, explainedFailure, explainFailure(false, true, false, 0))
	require.Equal(t, unexplainedFailure, explainFailure(false, false, true, 0), "a timeout of a process that ran")
	require.Equal(t, unexplainedFailure, explainFailure(false, false, true, starvedShare-time.Millisecond))
	require.Equal(t, starvedTimeout, explainFailure(false, false, true, starvedShare))
	require.Equal(t, unexplainedFailure, explainFailure(false, false, false, time.Hour), "starvation excuses no other error")
	// The probe's own arithmetic and a real stop: lab/stallprobe.
}
