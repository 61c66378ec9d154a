package workload

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// A sharded run (--prefill-tp, --decode-tp): one prefill engine per prefill
// TP rank, each with its own pool, its own stream of one virtual GPU (the
// ranks' forwards run concurrently, as real TP ranks' do) and its own
// transport, so its own modeled link; one decode pool per decode TP rank,
// added to every engine as a peer with its sharding. Each request is
// registered on every engine with one destination per decode rank; the
// engines route each byte through cp/reshard. The model writes every rank's
// share of one logical tensor: the bytes of (room, layer, kind, token, head)
// are a pattern of those values, so every decode byte is checked against
// what the whole-tensor reshard puts there, head slice by head slice.

func (c Config) sharded() bool {
	return c.PrefillTP > 0 || c.DecodeTP > 0 || c.PrefillPP > 0 || c.DecodePP > 0
}

// tpFlags names the pairing in errors, as the user spelled it.
func (c Config) tpFlags() string {
	pp := ""
	if c.PrefillPP > 0 || c.DecodePP > 0 {
		pp = fmt.Sprintf(" --prefill-pp %d --decode-pp %d", c.PrefillPP, c.DecodePP)
	}
	return fmt.Sprintf("--prefill-tp %d --decode-tp %d%s (--model %s)", c.PrefillTP, c.DecodeTP, pp, c.Preset.Name)
}

// evenStages splits layers into pp stages of sizes differing by at most
// one (nil: one stage). More stages than layers leave one empty, which the
// pairing's validation names.
func evenStages(layers, pp int) []int {
	if pp <= 1 {
		return nil
	}
	out := make([]int, pp+1)
	for s := range out {
		out[s] = s * layers / pp
	}
	return out
}

func badFlag(err error, format string, args ...any) error {
	return errors.Mark(errors.Wrapf(err, format, args...), system.ErrBadInput)
}

// shardedGeometry checks the pairing (before anything is allocated) and
// picks the scale: a divisor of the head dim, so that head slicing, and so
// every write count, stays the real one while the bytes shrink.
func (c Config) shardedGeometry(g *geometry) error {
	g.sharded = true
	p := c.Preset
	if p.KVHeads < 1 || p.HeadDim < 1 || p.ElemBytes < 1 {
		return errors.Newf("--model %s: no KV head geometry, cannot shard", p.Name)
	}
	pre := reshard.Side{Layers: g.layers, KVHeads: p.KVHeads, HeadDim: p.HeadDim, ElemBytes: p.ElemBytes, MLA: p.MLA,
		TP: max(1, c.PrefillTP), PageSize: c.PageSize, Order: c.PageOrder}
	dec := pre
	dec.TP = max(1, c.DecodeTP)
	if c.PrefillTP < 0 || c.DecodeTP < 0 || c.PrefillPP < 0 || c.DecodePP < 0 {
		return errors.Mark(errors.Newf("%s: TP and PP degrees must not be negative", c.tpFlags()), system.ErrBadInput)
	}
	pre.Stages, dec.Stages = evenStages(g.layers, c.PrefillPP), evenStages(g.layers, c.DecodePP)
	pair := reshard.Pairing{Prefill: pre, Decode: dec}
	if _, err := reshard.NewPlan(&pair, reshard.Rank{}); err != nil {
		return badFlag(err, "%s", c.tpFlags())
	}
	for st := 0; st < pre.PP(); st++ {
		if lo, _ := pre.StageLayers(st); lo >= g.hookLayers {
			return errors.Mark(errors.Newf("%s: prefill PP stage %d holds only layers without a hook (from %d on)", c.tpFlags(), st, g.hookLayers), system.ErrBadInput)
		}
	}
	g.preReal, g.decReal = pre, dec
	g.pageBytes = int(pre.ItemLen()) // one prefill rank's page of one buffer, as the report's item
	pool := float64(g.pagesPerRequest * g.resident)
	need := max(float64(pre.TP)*float64(pre.ItemLen()), float64(dec.TP)*float64(dec.ItemLen())) * pool * float64(g.buffers)
	budget := float64(c.MemoryBudget)
	if budget <= 0 {
		budget = 256 << 20
	}
	g.scale = c.Scale
	switch {
	case g.scale > 0 && p.HeadDim%g.scale != 0:
		return errors.Mark(errors.Newf("--scale %d: a sharded run scales the head dim, and %d does not divide %s's %d",
			g.scale, g.scale, p.Name, p.HeadDim), system.ErrBadInput)
	case g.scale == 0:
		g.scale = p.HeadDim
		for s := 1; s <= p.HeadDim; s++ {
			if p.HeadDim%s == 0 && need/float64(s) <= budget {
				g.scale = s
				break
			}
		}
	}
	g.preSide, g.decSide = pre, dec
	g.preSide.HeadDim /= g.scale
	g.decSide.HeadDim /= g.scale
	g.itemLen = int(g.preSide.ItemLen())
	g.byteScale = float64(g.scale)
	return nil
}

// pageFill writes what a model writes into one page of (layer, kind) of TP
// rank tp on side s for request position pos: every head the rank holds,
// each (token, head) its own pattern, laid out in the side's page order.
func pageFill(dst []byte, s *reshard.Side, tp int, seed, room uint64, layer, kind, pos int) {
	lo, hi := s.RankHeads(tp)
	per, hb := hi-lo, int(s.HeadBytes())
	for t := 0; t < s.PageSize; t++ {
		for h := lo; h < hi; h++ {
			off := (t*per + h - lo) * hb
			if s.Order == reshard.HeadMajor {
				off = ((h-lo)*s.PageSize + t) * hb
			}
			testbed.Fill(dst[off:off+hb], seed, room, layer*2+kind, (pos*s.PageSize+t)*s.KVHeads+h)
		}
	}
}

// layerKind is buffer b's model layer and kind in testbed's layout of PP
// stage st's pool (K of every layer of the stage, then V; MLA one per
// layer).
func layerKind(s *reshard.Side, st, b int) (layer, kind int) {
	lo, hi := s.StageLayers(st)
	if s.MLA {
		return lo + b, 0
	}
	return lo + b%(hi-lo), b / (hi - lo)
}

// geometryOf is the pool of a rank of PP stage st.
func geometryOf(s *reshard.Side, st, pages int) testbed.Geometry {
	lo, hi := s.StageLayers(st)
	if s.MLA {
		return testbed.MLA(hi-lo, s.ItemLen(), pages)
	}
	return testbed.KV(hi-lo, s.ItemLen(), pages)
}

func rankStream(st, r int) string { return fmt.Sprintf("prefill-pp%d-tp%d", st, r) }

// shardedDecode is the decode side of a sharded run and its byte check.
type shardedDecode struct {
	cfg   Config
	g     geometry
	p     *plan
	pools []*testbed.Decode

	mu       sync.Mutex
	snaps    map[int][]snapshot // by room, until the room is checked
	mismatch string             // the first a release found
}

// snapshot is a chunk's decode pages on every decode rank, copied the
// moment the chunk's last Finish returned SUCCESS: a write that lands after
// Finish, or a read of a source before its kernel ended, shows in it even
// when the end of the run would pass. Checking it against the pattern costs
// a hash per (token, head) on every decode rank, so that happens after the
// run, out of the timed window; the copy is a memcpy per page.
type snapshot struct {
	room      int
	positions []int
	pages     [][]byte // rank * len(positions) * buffers + i * buffers + b
}

func (d *shardedDecode) snapshot(room int, positions []int) snapshot {
	s := snapshot{room: room, positions: positions}
	for _, pool := range d.pools {
		for _, x := range positions {
			for b := 0; b < pool.Buffers(); b++ {
				s.pages = append(s.pages, append([]byte(nil), pool.Page(b, d.p.dst(room)[x])...))
			}
		}
	}
	return s
}

// check compares room's positions on every decode rank (page gives the
// bytes of one) with the reshard of the logical tensor: owned positions
// (all when owned is nil) hold the pattern of their heads, every other
// page zeros. It returns the first difference, or "".
func (d *shardedDecode) check(room int, positions []int, owned map[int]bool, when string, page func(rank, i, b int) []byte) string {
	dec := &d.g.decSide
	want := make([]byte, dec.ItemLen())
	zero := make([]byte, dec.ItemLen())
	for rank, pool := range d.pools {
		st, tp := rank/dec.TP, rank%dec.TP
		for i, x := range positions {
			for b := 0; b < pool.Buffers(); b++ {
				w := zero
				if owned == nil || owned[x] {
					layer, kind := layerKind(dec, st, b)
					pageFill(want, dec, tp, d.cfg.Seed, uint64(room), layer, kind, x)
					w = want
				}
				if got := page(rank, i, b); !bytes.Equal(got, w) {
					return fmt.Sprintf("decode TP rank %d (PP stage %d) room %d position %d (decode page %d) buffer %s: %s, %s",
						tp, st, room, x, d.p.dst(room)[x], pool.Names[b], when, describe(got, w))
				}
			}
		}
	}
	return ""
}

// checkSnapshots checks, and drops, room's chunk snapshots.
func (d *shardedDecode) checkSnapshots(room int) string {
	d.mu.Lock()
	snaps := d.snaps[room]
	delete(d.snaps, room)
	d.mu.Unlock()
	for _, sn := range snaps {
		n := len(sn.positions)
		first := make([]int, len(d.pools)) // the snapshot's index of each rank's first page
		for rank := 1; rank < len(d.pools); rank++ {
			first[rank] = first[rank-1] + n*d.pools[rank-1].Buffers()
		}
		page := func(rank, i, b int) []byte { return sn.pages[first[rank]+i*d.pools[rank].Buffers()+b] }
		if msg := d.check(sn.room, sn.positions, nil, "at Finish SUCCESS", page); msg != "" {
			return msg
		}
	}
	return ""
}

// checkRoom checks a finished room: each chunk's snapshot (taken when it
// succeeded), then every decode page of the room as it is now (owned
// positions hold their heads' pattern, the rest zeros). It drops the
// room's snapshots.
func (d *shardedDecode) checkRoom(room int, when string) string {
	if msg := d.checkSnapshots(room); msg != "" {
		return msg
	}
	owned := map[int]bool{}
	_, pos, _ := d.cfg.CP.Owned(d.p.src(room), 0, d.g.pagesPerRequest)
	for _, x := range pos {
		owned[x] = true
	}
	all := make([]int, d.g.pagesPerRequest)
	for x := range all {
		all[x] = x
	}
	page := func(rank, i, b int) []byte { return d.pools[rank].Page(b, d.p.dst(room)[all[i]]) }
	return d.check(room, all, owned, when, page)
}

// release checks a finished room and zeroes its decode pages on every
// rank, before another room takes its slot (see residency).
func (d *shardedDecode) release(room int) {
	if msg := d.checkRoom(room, "when its slot was released"); msg != "" {
		d.mu.Lock()
		if d.mismatch == "" {
			d.mismatch = msg
		}
		d.mu.Unlock()
	}
	for _, pool := range d.pools {
		for _, pg := range d.p.dst(room) {
			for b := 0; b < pool.Buffers(); b++ {
				clear(pool.Page(b, pg))
			}
		}
	}
}

// verify is the run's verdict: the first mismatch a release found, else
// the check of every room still resident, else that of any snapshot left
// (a room the run did not release: none when every earlier room was).
func (d *shardedDecode) verify(from, to int) string {
	d.mu.Lock()
	msg := d.mismatch
	d.mu.Unlock()
	for room := from; room < to && msg == ""; room++ {
		msg = d.checkRoom(room, "at the end of the run")
	}
	d.mu.Lock()
	var left []int
	for room := range d.snaps {
		left = append(left, room)
	}
	d.mu.Unlock()
	sort.Ints(left)
	for _, room := range left {
		if msg != "" {
			break
		}
		msg = d.checkSnapshots(room)
	}
	return msg
}

// runSharded runs the schedule in one mode on fresh engines, pools and GPU.
// remote, when set, is the decode side (another process's decode ranks,
// over a real transport); nil: the sim's pools and modeled links.
func runSharded(ctx context.Context, cfg Config, g geometry, p *plan, perLayer bool, log *zap.Logger, progress func(), remote ShardedPlane) (*ModeReport, error) {
	col := &collector{kernels: map[string]sim.Span{}, byStream: map[string]map[string]sim.Span{}}
	fab := loopback.NewFabric(loopback.Options{
		Bandwidth: cfg.LinkGbps * 1e9 / 8, Latency: cfg.LinkLatency, TimeScale: cfg.TimeScale, ByteScale: g.byteScale, Precise: true,
		Slow: cfg.plantSlow,
	})
	gpu := sim.New(sim.Options{TimeScale: cfg.TimeScale, OnSpan: col.span, Precise: true})
	var cleanup []func()
	defer func() {
		gpu.Close() // no kernel writes a pool any more
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()

	dd := &shardedDecode{cfg: cfg, g: g, p: p, snaps: map[int][]snapshot{}}
	var peers []system.Peer
	var shared rdma.Transport // the remote run's: every prefill rank sends over it
	if remote != nil {
		var err error
		if shared, peers, err = openRemote(remote, cfg, g, p, log); err != nil {
			return nil, err
		}
		defer remote.Close()
	}
	for i := 0; remote == nil && i < g.decSide.PP()*g.decSide.TP; i++ {
		st, d := i/g.decSide.TP, i%g.decSide.TP
		name := fmt.Sprintf("decode-pp%d-tp%d", st, d)
		tr, err := fab.NewTransport(name)
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, func() { _ = tr.Close() })
		pool, err := testbed.NewDecode(tr, geometryOf(&g.decSide, st, p.pool))
		if err != nil {
			return nil, errors.Wrapf(err, "decode PP stage %d TP rank %d pool", st, d)
		}
		cleanup = append(cleanup, func() { _ = pool.Free() })
		dd.pools = append(dd.pools, pool)
		peer := pool.Peer(name)
		peer.Sharding = &system.Sharding{Side: g.decSide, Rank: reshard.Rank{TP: d, Stage: st}}
		peers = append(peers, peer)
	}

	// The transport oracle (landGuard, see runMode) sits below each prefill
	// rank's engine when the decode pools are the sim's own: it tells a
	// page by its decode rank and page number.
	locate := func(addr uint64) (string, int, int, bool) {
		for r, pool := range dd.pools {
			per := pool.ItemLen * uint64(pool.Pages)
			for b, base := range pool.Bases {
				if addr >= base && addr < base+per {
					pg := int((addr - base) / pool.ItemLen)
					return fmt.Sprintf("%s of decode rank %d", pool.Names[b], r), pg, pageKey(r, pg), true
				}
			}
		}
		return "", 0, 0, false
	}
	var guards []*landGuard // per prefill rank; none with a remote decode side
	expect := func(ri int, pc piece) {
		if guards == nil {
			return
		}
		keys := make([]int, 0, len(pc.positions)*len(dd.pools))
		for _, x := range pc.positions {
			for r := range dd.pools {
				keys = append(keys, pageKey(r, p.dst(pc.room)[x]))
			}
		}
		guards[ri].expect(pc.room, pc.start, pc.end, pc.positions, keys)
	}

	usPerKTok := cfg.Preset.LayerUsPerKTok
	if cfg.LayerUsPerKTok > 0 {
		usPerKTok = cfg.LayerUsPerKTok
	}
	type rank struct {
		eng        *system.Engine
		model      *testbed.Model
		stream     *sim.Stream
		stage      int
		before     int // layers of the earlier PP stages
		lastLocal  int // the stage's last layer, numbered within it
		streamName string
	}
	var ranks []rank
	var prePools []*testbed.Pool
	for i := 0; i < g.preSide.PP()*g.preSide.TP; i++ {
		st, r := i/g.preSide.TP, i%g.preSide.TP
		lo, hi := g.preSide.StageLayers(st)
		tr := shared
		if tr == nil {
			raw, err := fab.NewTransport(rankStream(st, r))
			if err != nil {
				return nil, err
			}
			cleanup = append(cleanup, func() { _ = raw.Close() })
			gd := newLandGuard(raw, locate)
			guards = append(guards, gd)
			tr = gd
			if cfg.plantTransport != nil {
				tr = cfg.plantTransport(tr)
			}
		}
		pool, err := testbed.NewPool(geometryOf(&g.preSide, st, p.pool))
		if err != nil {
			return nil, errors.Wrapf(err, "prefill PP stage %d TP rank %d pool", st, r)
		}
		cleanup = append(cleanup, func() { _ = pool.Free() })
		fill(pool.Block.Bytes, staleByte)
		prePools = append(prePools, pool)
		stream := gpu.NewStream(rankStream(st, r))
		hooks := min(hi, g.hookLayers) - lo
		opts := []system.Option{system.WithStream(stream), system.WithTransport(tr), system.WithObserver(col), system.WithLogger(log)}
		if i == 0 {
			// Metrics and the message trace are one engine's: rank 0's.
			opts = engineOptions(cfg, perLayer, opts...)
		}
		ecfg := system.Config{
			Buffers: pool.EngineBuffers(), HookLayers: hooks, GroupSize: cfg.GroupSize, PageSize: cfg.PageSize,
			CP: cfg.CP, Submitters: cfg.Submitters, FinishTimeout: cfg.FinishTimeout, DisablePerLayer: !perLayer,
			Sharding: &system.Sharding{Side: g.preSide, Rank: reshard.Rank{TP: r, Stage: st}},
		}
		if cfg.plant != nil {
			cfg.plant(ecfg.Buffers)
		}
		if cfg.plantShard != nil {
			cfg.plantShard(i, &ecfg)
		}
		eng, err := system.New(ecfg, opts...)
		if err != nil {
			return nil, errors.Wrapf(err, "prefill PP stage %d TP rank %d", st, r)
		}
		cleanup = append(cleanup, func() { _ = eng.Close() })
		for _, peer := range peers {
			if err := eng.AddPeer(peer); err != nil {
				return nil, errors.Wrapf(err, "prefill PP stage %d TP rank %d", st, r)
			}
		}
		side, tp := &g.preSide, r
		model := &testbed.Model{Stream: stream, Pool: pool, HookLayers: hooks, Seed: cfg.Seed,
			LayerTime: func(tokens int) time.Duration {
				return time.Duration(float64(tokens) / 1000 * usPerKTok * float64(time.Microsecond))
			},
			Fill: func(dst []byte, room uint64, b, pos int) {
				layer, kind := layerKind(side, st, b)
				pageFill(dst, side, tp, cfg.Seed, room, layer, kind, pos)
			}}
		ranks = append(ranks, rank{eng: eng, model: model, stream: stream, stage: st, before: lo, lastLocal: hi - lo - 1, streamName: rankStream(st, r)})
	}
	if lost, ok := remote.(interface{ OnPeerLost(func(error)) }); ok {
		// The decode ranks share a process: any loss fails the work to
		// every one of them at once instead of at the finish timeout.
		lost.OnPeerLost(func(cause error) {
			for _, rk := range ranks {
				for _, peer := range peers {
					rk.eng.PeerLost(peer.ID, cause)
				}
			}
		})
	}

	// One transfer worker per slot and prefill rank finishes the slot's
	// request's chunks on that rank in send order; a chunk is snapshotted
	// on every decode rank when its last rank's Finish returned SUCCESS, and
	// checked when its request is released or at the end of the run. A
	// remote decode side is told how the chunk ended then instead, and
	// checks it before the slot can be released.
	mr := &ModeReport{PerLayer: perLayer, Forwards: len(p.forwards)}
	rs := newResidency(p, cfg.Requests, len(ranks), func(room int) {
		if remote == nil {
			dd.release(room)
		}
		for _, pool := range prePools {
			restale(pool, p.src(room))
		}
	})
	var nt *notifier
	if remote != nil {
		nt = newNotifier(p.resident, p.maxChunks, remote.ChunkDone) // see runMode
	}
	stop := newStopper(ctx, cfg.Drain, cfg.Requests)
	var pmu sync.Mutex
	left := map[[2]int]*chunkOutcome{}
	work := make([][]chan piece, p.resident)
	var wg sync.WaitGroup
	for slot := range work {
		for ri, rk := range ranks {
			ch := make(chan piece, p.maxChunks) // one request's chunks at a time (see runMode)
			work[slot] = append(work[slot], ch)
			wg.Add(1)
			go func(ri int, eng *system.Engine) {
				defer wg.Done()
				for pc := range ch {
					room := pc.room
					call := time.Now()
					res, err := eng.Finish(stop.finishCtx(), uint64(room))
					ret := time.Now()
					if guards != nil && err == nil && res.Status == system.Succeeded {
						guards[ri].finished(room, pc.start)
					}
					col.mu.Lock()
					col.finishes = append(col.finishes, finishRec{room: room, forward: pc.forward, chunk: res.Chunk, call: call, ret: ret, status: res.Status, stats: res.Stats,
						ok: finished(res.Status, err)})
					if err != nil {
						mr.Failed++
						if mr.FirstError == "" {
							mr.FirstError = fmt.Sprintf("prefill TP rank %d: %v", ri, err)
						}
					}
					col.mu.Unlock()
					key := [2]int{room, pc.start}
					pmu.Lock()
					st := left[key]
					if st == nil {
						st = newOutcome(len(ranks))
						left[key] = st
					}
					st.add(res, err)
					last, done := st.left == 0, st.left == 0 && st.ok
					if st.left == 0 {
						delete(left, key)
					}
					if last && nt != nil {
						// Queued under the lock: the chunks of a room reach
						// the notifier in order whichever rank ends each.
						var after func()
						if pc.last {
							after = func() { rs.finished(room) }
						}
						nt.notify(room, notice(cfg, g, p, pc, st.result()), after)
					}
					pmu.Unlock()
					if last && nt != nil {
						continue // the notice releases this rank's share of the slot
					}
					if done {
						snap := dd.snapshot(room, pc.positions)
						dd.mu.Lock()
						dd.snaps[room] = append(dd.snaps[room], snap)
						dd.mu.Unlock()
					}
					if pc.last {
						rs.finished(room)
					}
				}
			}(ri, rk.eng)
		}
	}

	t0 := time.Now()
	forwardEnds := make([]time.Time, len(p.forwards))
	var loopErr error
	launched := 0
forwards:
	for k, fw := range p.forwards {
		if mr.Aborted = stop.interrupted(k + 1); mr.Aborted != "" {
			break
		}
		if fw = stop.keep(fw); len(fw) == 0 {
			continue // drained (see runMode)
		}
		for _, pc := range fw {
			if pc.start == 0 {
				if err := rs.admit(ctx, pc.room); err != nil {
					if mr.Aborted = stop.interrupted(k + 1); mr.Aborted == "" {
						loopErr = errors.Wrapf(err, "forward %d: waiting for a slot for request %d", k+1, pc.room)
					}
					break forwards
				}
			}
		}
		tokens := 0
		for _, pc := range fw {
			tokens += pc.end - pc.start
		}
		for ri, rk := range ranks {
			if rk.before > 0 {
				// A later PP stage starts when the earlier ones computed
				// their layers (no pipelining across forwards: the loop
				// waits for every stage at the end of each).
				pad := sim.Kernel{Name: fmt.Sprintf("f%d wait for stage %d", k+1, rk.stage), Duration: time.Duration(rk.before) * cfg.layerTime(tokens)}
				if loopErr = rk.stream.Launch(pad); loopErr != nil {
					break forwards
				}
			}
			writes := make([]testbed.Write, 0, len(fw))
			for _, pc := range fw {
				spec := system.ChunkSpec{Room: uint64(pc.room), Start: pc.start, End: pc.end, Last: pc.last,
					SrcPages: p.src(pc.room)[pc.rng.PageStart : pc.rng.PageStart+pc.rng.Pages], TotalPages: g.pagesPerRequest}
				for _, peer := range peers {
					spec.Infos = append(spec.Infos, system.DecodeInfo{Peer: peer.ID, DstPages: p.dst(pc.room)})
				}
				expect(ri, pc) // before any of its batches can be posted
				if _, err := rk.eng.Register(ctx, spec); err != nil {
					if remote == nil {
						loopErr = errors.Wrapf(err, "forward %d", k+1)
						break forwards
					}
					// As runMode: the decode side was lost or refused.
					mr.Aborted = errors.Wrapf(err, "forward %d", k+1).Error()
					break forwards
				}
				writes = append(writes, testbed.Write{Room: uint64(pc.room), PageStart: pc.rng.PageStart, SrcPages: spec.SrcPages, Tokens: pc.end - pc.start})
			}
			// Forward only enqueues: the ranks' streams run concurrently.
			if err := rk.model.Forward(rk.eng, writes); err != nil {
				loopErr = errors.Wrapf(err, "forward %d", k+1)
				break forwards
			}
		}
		launched++
		for _, rk := range ranks {
			sctx, cancel := stop.syncCtx()
			loopErr = rk.stream.Synchronize(sctx)
			cancel()
			if loopErr != nil {
				break forwards
			}
		}
		runtime.Gosched() // see runMode
		for _, rk := range ranks {
			end, ok := col.streamKernel(rk.streamName, testbed.KernelName(k+1, rk.lastLocal))
			if !ok {
				loopErr = errors.AssertionFailedf("forward %d: no span for %s's last kernel", k+1, rk.streamName)
				break forwards
			}
			if end.End.After(forwardEnds[k]) {
				forwardEnds[k] = end.End // the latest rank's
			}
		}
		for _, pc := range fw {
			for _, ch := range work[pc.room%p.resident] {
				ch <- pc
			}
		}
		progress()
	}
	for _, chs := range work {
		for _, ch := range chs {
			close(ch)
		}
	}
	wg.Wait()
	if nt != nil {
		nt.close()
	}
	if loopErr != nil {
		return nil, loopErr
	}
	mr.WallSeconds = time.Since(t0).Seconds()
	mr.SlotWaits = rs.slotWaits()
	mr.countDone(p, col, launched, len(ranks))
	if mr.NotStarted = stop.drained(); mr.NotStarted > 0 && mr.Aborted == "" {
		mr.Aborted = fmt.Sprintf("drained: %d of %d requests not started", mr.NotStarted, cfg.Requests)
	}
	if mr.Aborted != "" {
		mr.moved(col, launched)
		return mr, nil
	}
	if remote != nil {
		mr.mismatch = remote.Verify(nil)
	} else {
		mr.mismatch = dd.verify(rs.stillResident())
	}
	mr.summarize(cfg, g, p, col, t0, forwardEnds)
	for ri, gd := range guards {
		for _, v := range gd.violations() {
			mr.oracle = append(mr.oracle, fmt.Sprintf("prefill rank %d: %s", ri, v))
		}
	}
	return mr, nil
}

// shardedFloors is floors for a sharded run. Every prefill rank has its own
// link (its NIC: loopback models one per sending node), shared by the
// batches to all the decode ranks it feeds and served in order as floors
// does; the decode side's ingress is not modeled (nor is it by loopback).
// A batch carries, per page the rank owns, route.PageBytes (the real bytes
// of the heads it sends that decode rank) per buffer of the batch's layers
// that the route takes (PP: the layers both stages hold). A request's floor
// is its last landing over all ranks minus the end of its last forward on
// the latest rank, as its exposed time is measured. ends gives the end of
// layer l (numbered within the stage) of forward k on the rank (st, r).
func shardedFloors(cfg Config, g geometry, p *plan, perLayer bool, ends func(st, r, k, l int) time.Duration) []float64 {
	kinds := g.preReal.Kinds()
	lastForward := make([]int, cfg.Requests)
	for k, fw := range p.forwards {
		for _, pc := range fw {
			lastForward[pc.room] = k
		}
	}
	pair := reshard.Pairing{Prefill: g.preReal, Decode: g.decReal}
	lastLand := make([]time.Duration, cfg.Requests)
	lastEnd := make([]time.Duration, cfg.Requests)
	for i := 0; i < g.preReal.PP()*g.preReal.TP; i++ {
		st, r := i/g.preReal.TP, i%g.preReal.TP
		lo, hi := g.preReal.StageLayers(st)
		hooks := min(hi, g.hookLayers) - lo
		groups := (hooks + cfg.GroupSize - 1) / cfg.GroupSize
		pl, err := reshard.NewPlan(&pair, reshard.Rank{TP: r, Stage: st})
		if err != nil {
			panic(err) // validated by shardedGeometry
		}
		var routes []*reshard.Route
		for j := range pl.Routes {
			if rt := &pl.Routes[j]; !rt.Empty() {
				routes = append(routes, rt)
			}
		}
		var batches []linkBatch
		// add queues, for each destination, the batch of the model layers
		// [a, b) that its route takes.
		add := func(room int, ready time.Duration, pages, a, b int) {
			for _, rt := range routes {
				layers := min(b, rt.LayerHi) - max(a, rt.LayerLo)
				if n := float64(pages) * float64(max(layers, 0)*kinds) * float64(rt.PageBytes()); n > 0 {
					batches = append(batches, linkBatch{room: room, ready: ready, bytes: n, order: len(batches)})
				}
			}
		}
		for k, fw := range p.forwards {
			end := ends(st, r, k, hi-lo-1)
			if !perLayer {
				for _, pc := range fw {
					add(pc.room, end, pc.owned, lo, hi)
				}
				continue
			}
			for gi := 0; gi < groups; gi++ {
				a, b := gi*cfg.GroupSize, min((gi+1)*cfg.GroupSize, hooks)
				for _, pc := range fw {
					add(pc.room, ends(st, r, k, b-1), pc.owned, lo+a, lo+b)
				}
			}
			for _, pc := range fw {
				add(pc.room, end, pc.owned, lo+hooks, hi)
			}
		}
		land := idealLandings(batches, cfg.LinkGbps*1e9/8, cfg.LinkLatency)
		for j, b := range batches {
			lastLand[b.room] = max(lastLand[b.room], land[j])
		}
		for room := range lastEnd {
			lastEnd[room] = max(lastEnd[room], ends(st, r, lastForward[room], hi-lo-1))
		}
	}
	out := make([]float64, cfg.Requests)
	for room := range out {
		out[room] = msf(max(lastLand[room]-lastEnd[room], 0))
	}
	return out
}
