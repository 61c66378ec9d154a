package workload

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// The rig: one run of the schedule in one mode, on fresh engines, prefill
// pools and GPU, with a decode side (decodeSide). An unsharded run is one
// prefill rank feeding one decode rank; a sharded run (--prefill-tp,
// --decode-tp, PP) has one prefill engine per (PP stage, TP rank), each
// with its own pool, its own stream of one virtual GPU (the ranks'
// forwards run concurrently, as real TP ranks' do) and its own transport,
// and one decode pool per decode rank, added to every engine as a peer
// with its sharding. Each request is registered on every engine with one
// destination per decode rank; the engines route each byte through
// cp/reshard. The model writes every rank's share of one logical tensor:
// the bytes of (room, layer, kind, token, head) are a pattern of those
// values, so every decode byte is checked against what the whole-tensor
// reshard puts there.

// rank is one prefill (PP stage, TP rank) engine of a run.
type rank struct {
	eng    *system.Engine
	model  *testbed.Model
	stream *sim.Stream
	pool   *testbed.Pool
	stage  int
	// before and after count the layers of the earlier and of the later PP
	// stages, lastLocal is the stage's last layer, numbered within it.
	before, after, lastLocal int
}

// rig is one run's prefill ranks and decode side.
type rig struct {
	cfg  Config
	g    geometry
	p    *plan
	side decodeSide
	col  *collector
	// faults injects --fault into the prefill transports.
	faults *injector
	peers  []system.Peer // the decode ranks, as every engine adds them
	ranks  []*rank       // stage-major
	// cleanup frees what the ranks hold, in reverse, once their engines
	// and the GPU are closed.
	cleanup []func()
}

// addRanks builds the run's prefill ranks, each an engine over its
// transport from the decode side, with every peer added. Whatever it built
// is in r.ranks and r.cleanup, also when it fails.
func (r *rig) addRanks(perLayer bool, log *zap.Logger, gpu *sim.GPU) error {
	cfg, g, p, side := r.cfg, r.g, r.p, r.side
	stages, tps := 1, 1
	if g.sharded {
		stages, tps = g.preSide.PP(), g.preSide.TP
	}
	for i := 0; i < stages*tps; i++ {
		st, tp := i/tps, i%tps
		lo, hi := 0, g.layers
		name, label := "compute", "prefill"
		if g.sharded {
			lo, hi = g.preSide.StageLayers(st)
			name, label = rankStream(st, tp), fmt.Sprintf("prefill PP stage %d TP rank %d", st, tp)
		}
		// rankErr names the rank in a sharded run's errors.
		rankErr := func(err error) error {
			if g.sharded {
				return errors.Wrap(err, label)
			}
			return err
		}
		tr, err := side.transport(i, r.faults)
		if err != nil {
			return err
		}
		if !side.remote() && cfg.plantTransport != nil {
			tr = cfg.plantTransport(tr)
		}
		geom := prefillGeometry(cfg, g, st, p.pool)
		pool, err := testbed.NewPool(geom)
		if err != nil {
			return errors.Wrapf(err, "%s pool of %d MiB", label, geom.Buffers()*int(geom.ItemLen)*p.pool>>20)
		}
		r.cleanup = append(r.cleanup, func() { _ = pool.Free() })
		fill(pool.Block.Bytes, staleByte) // stale KV: a read before the write would copy this
		stream := gpu.NewStream(name)
		hooks := min(hi, g.hookLayers) - lo
		opts := []system.Option{system.WithStream(stream), system.WithTransport(tr), system.WithObserver(r.col), system.WithLogger(log)}
		if i == 0 {
			// Metrics and the message trace are one engine's: rank 0's.
			opts = engineOptions(cfg, perLayer, opts...)
		}
		ecfg := system.Config{
			Buffers: pool.EngineBuffers(), HookLayers: hooks, GroupSize: cfg.GroupSize, PageSize: cfg.PageSize,
			CP: cfg.CP, Submitters: cfg.Submitters, FinishTimeout: cfg.FinishTimeout, DisablePerLayer: !perLayer,
		}
		if g.sharded {
			ecfg.Sharding = &system.Sharding{Side: g.preSide, Rank: reshard.Rank{TP: tp, Stage: st}}
		}
		if cfg.autoModel != nil {
			ecfg.GroupSize, ecfg.AutoGroup = 0, cfg.autoModel
		}
		if cfg.plant != nil {
			cfg.plant(ecfg.Buffers)
		}
		if cfg.plantShard != nil {
			cfg.plantShard(i, &ecfg)
		}
		eng, err := system.New(ecfg, opts...)
		if err != nil {
			return rankErr(err)
		}
		model := &testbed.Model{Stream: stream, Pool: pool, HookLayers: hooks, Seed: cfg.Seed, LayerTime: cfg.layerTime}
		if g.sharded {
			pre := &g.preSide
			model.Fill = func(dst []byte, room uint64, b, pos int) {
				layer, kind := layerKind(pre, st, b)
				pageFill(dst, pre, tp, cfg.Seed, room, layer, kind, pos)
			}
		}
		r.ranks = append(r.ranks, &rank{eng: eng, model: model, stream: stream, pool: pool, stage: st,
			before: lo, after: g.layers - hi, lastLocal: hi - lo - 1})
		if k := eng.GroupSize(); k != cfg.GroupSize {
			return errors.AssertionFailedf("the engine runs K = %d, the sim's floor assumes %d", k, cfg.GroupSize)
		}
		for _, peer := range r.peers {
			if err := eng.AddPeer(peer); err != nil {
				return rankErr(err)
			}
		}
	}
	return nil
}

// runRig runs the whole schedule in one mode (perLayer or monolithic) with
// the decode side side.
func runRig(ctx context.Context, cfg Config, g geometry, p *plan, perLayer bool, log *zap.Logger, progress func(), side decodeSide) (_ *ModeReport, err error) {
	rg := &rig{cfg: cfg, g: g, p: p, side: side, col: newCollector(), faults: newInjector(cfg.Fault, cfg.Seed, perLayer)}
	col := rg.col
	if rg.peers, err = side.open(ctx, log); err != nil {
		return nil, err
	}
	gpu := sim.New(sim.Options{TimeScale: cfg.TimeScale, OnSpan: col.span, Precise: true})
	rg.cleanup = []func(){side.close}
	defer func() {
		for i, rk := range rg.ranks {
			// Close writes the message trace (--record, rank 0's): a trace
			// that could not be written is the run's error, not a silent
			// empty file.
			if cerr := rk.eng.Close(); i == 0 && cerr != nil && err == nil {
				err = errors.Wrap(cerr, "close the engine")
			}
		}
		gpu.Close() // no kernel writes a pool any more
		for i := len(rg.cleanup) - 1; i >= 0; i-- {
			rg.cleanup[i]()
		}
	}()
	if err := rg.addRanks(perLayer, log, gpu); err != nil {
		return nil, err
	}
	ranks, peers := rg.ranks, rg.peers
	pools := make([]*testbed.Pool, len(ranks))
	for i, rk := range ranks {
		pools[i] = rk.pool
	}
	side.prefill(pools)
	// The decode ranks of a remote side share a process: any loss fails
	// the work to every one of them at once instead of at the finish
	// timeout.
	side.OnPeerLost(func(cause error) {
		for _, rk := range ranks {
			for _, peer := range peers {
				rk.eng.PeerLost(peer.ID, cause)
			}
		}
	})

	mr := &ModeReport{PerLayer: perLayer, Forwards: len(p.forwards)}
	rs := newResidency(p, cfg.Requests, len(ranks), func(room int) {
		side.Release(room)
		for _, pool := range pools {
			restale(pool, p.src(room))
		}
	})
	stop := newStopper(ctx, cfg.Drain, cfg.Requests)
	ws := rg.startWorkers(mr, rs, stop)

	// The loop runs one forward ahead of the GPU: forward k is enqueued on
	// every rank (and its chunks handed to their workers, whose Finish
	// waits for its end) once forward k-1's first kernel ended on rank 0,
	// so that at a forward's end the next one is already queued and this
	// loop's host work (registering, enqueueing some sixty kernels a rank:
	// tenths of a millisecond on two cores) is not in the window where that
	// forward's last batches land. On a serving host the forward loop has
	// its own core. Rank 0's first kernel is enough: every rank runs the
	// same forwards back to back, and a later PP stage's forward k-1 starts
	// only after a pad (see below), so rank 0's is the earliest, and by
	// then forward k-2 ended on every rank.
	//
	// A sharded run instead waits for every rank's forward to end before it
	// enqueues the next, and hands a forward's chunks over then. Run one
	// ahead, sharded runs came out with higher and far more variable
	// per-layer ratios to the floor, and the two-process sharded run
	// exposed enough more under -race for a notice to the decode process to
	// time out. Which contention causes it is not known: this is a measured
	// choice, to measure again (kvstream sim with --prefill-tp and
	// --decode-tp, both ways) when the forward loop changes.
	syncEach := g.sharded
	t0 := time.Now()
	launched := 0 // forwards enqueued
	ended := 0    // forwards known to have ended (and told to Progress)
	prevTokens := 0
	var started cuda.Event
	var loopErr error
	skipped := false // a drain kept a forward from running
forwards:
	for k, fw := range p.forwards {
		if started != nil {
			// Not cut by an interrupt: its chunks are in the workers.
			sctx, cancel := stop.syncCtx()
			loopErr = started.Wait(sctx)
			cancel()
			if loopErr != nil {
				loopErr = errors.Wrapf(loopErr, "forward %d: wait for its first kernel", k)
				break
			}
			started = nil
			// The latest forward began: every one before it ended.
			for ; ended < launched-1; ended++ {
				progress()
			}
		}
		if mr.Aborted = stop.interrupted(k + 1); mr.Aborted != "" {
			break
		}
		if fw = stop.keep(fw); len(fw) == 0 {
			skipped = true
			continue // drained: no request of this forward was started
		}
		for _, pc := range fw {
			if pc.start == 0 {
				if err := rs.admit(ctx, pc.room); err != nil {
					// Nothing of this forward is registered yet.
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
			// PP stages do not pipeline across forwards: a stage starts its
			// layers of forward k once the later stages ended forward k-1
			// and the earlier ones computed forward k's first layers. The
			// streams run independently, so a pad kernel stands for both
			// waits (the earlier stages' forward k-1 ended with this one's);
			// when the loop waits for each forward, that wait is the first.
			pad := time.Duration(rk.before) * cfg.layerTime(tokens)
			if !syncEach {
				pad += time.Duration(rk.after) * cfg.layerTime(prevTokens)
			}
			if pad > 0 {
				if loopErr = rk.stream.Launch(sim.Kernel{Name: fmt.Sprintf("f%d wait for stage %d", k+1, rk.stage), Duration: pad}); loopErr != nil {
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
				side.expect(ri, pc)
				if _, err := rk.eng.Register(ctx, spec); err != nil {
					if !side.remote() {
						// The sim's own decode side refuses nothing.
						loopErr = errors.Wrapf(err, "forward %d", k+1)
						break forwards
					}
					// The decode side was lost (or refused): stop scheduling,
					// let what is registered finish (or fail), and report.
					mr.Aborted = errors.Wrapf(err, "forward %d", k+1).Error()
					break forwards
				}
				writes = append(writes, testbed.Write{Room: uint64(pc.room), PageStart: pc.rng.PageStart, SrcPages: spec.SrcPages, Tokens: pc.end - pc.start})
			}
			// Forward only enqueues: the ranks' streams run concurrently.
			var ev cuda.Event
			if ev, loopErr = rk.model.ForwardMarked(rk.eng, writes); loopErr != nil {
				loopErr = errors.Wrapf(loopErr, "forward %d", k+1)
				break forwards
			}
			if ri == 0 && !syncEach {
				started = ev
			}
		}
		launched++
		prevTokens = tokens
		if syncEach {
			sctx, cancel := stop.syncCtx()
			for _, rk := range ranks {
				if loopErr = rk.stream.Synchronize(sctx); loopErr != nil {
					break
				}
			}
			cancel()
			if loopErr != nil {
				break
			}
			for ; ended < launched; ended++ {
				progress()
			}
		}
		for _, pc := range fw {
			ws.hand(pc)
		}
	}
	// Every chunk handed over is finished before the run's own
	// bookkeeping below: after the last forward it would otherwise run
	// (the streams' synchronize, the forward ends, the workers' exits)
	// while the last chunks' batches land, on the CPU the link needs, and
	// the last request's exposed time would carry it.
	// Each Finish is bounded, also when the loop stopped early.
	ws.drain()
	if loopErr == nil {
		sctx, cancel := stop.syncCtx()
		for _, rk := range ranks {
			if loopErr = rk.stream.Synchronize(sctx); loopErr != nil {
				break
			}
		}
		cancel()
		for ; loopErr == nil && ended < launched; ended++ {
			progress()
		}
	}
	// A run that stopped early is not summarized: no forward ends needed.
	var forwardEnds []time.Time
	if loopErr == nil && !skipped && mr.Aborted == "" {
		forwardEnds, loopErr = col.forwardEnds(ranks, launched)
	}
	ws.stop()
	if loopErr != nil {
		return nil, loopErr
	}
	mr.WallSeconds = time.Since(t0).Seconds()
	mr.FaultsInjected = rg.faults.count()
	mr.FaultsPastLimit = rg.faults.pastResendLimit()
	mr.WorksResent, mr.ChunksResumed = col.resumes()
	mr.SlotWaits = rs.slotWaits()
	mr.countDone(p, col, launched, len(ranks))
	if mr.NotStarted = stop.drained(); mr.NotStarted > 0 && mr.Aborted == "" {
		mr.Aborted = fmt.Sprintf("drained: %d of %d requests not started", mr.NotStarted, cfg.Requests)
	}
	if mr.Aborted != "" {
		mr.moved(col, launched)
		return mr, nil
	}
	mr.mismatch = side.verify(rs.stillResident())
	mr.summarize(cfg, g, p, col, t0, forwardEnds)
	if ll, ok := side.(linkLagger); ok {
		var lags []float64
		for _, d := range ll.linkLag() {
			lags = append(lags, float64(d)*cfg.TimeScale/float64(time.Millisecond)) // modeled, as every time reported
		}
		mr.LinkLag = dist(lags)
	}
	mr.oracle = append(side.violations(), mr.oracle...)
	return mr, nil
}

// startWorkers starts one transfer worker per slot and prefill rank: it
// finishes the slot's request's chunks on that rank in send order, as soon
// as each chunk's forward ended; the forward loop never waits for it,
// except for a slot (see residency). Once every rank's Finish of a chunk
// returned, the decode side is told how it ended: the sim's own on the
// worker (it checks the chunk's pages the moment its Finish returned, so a
// write landing later shows), another process off the worker, through a
// notifier, which releases the slot only once its last notice was sent.
func (r *rig) startWorkers(mr *ModeReport, rs *residency, stop *stopper) *workers {
	g, p, ranks, side, col := r.g, r.p, r.ranks, r.side, r.col
	var nt *notifier
	if side.remote() {
		nt = newNotifier(p.resident, p.maxChunks, side.ChunkDone)
	}
	var mu sync.Mutex
	left := map[[2]int]*chunkOutcome{} // by room and chunk start
	// finish is rank ri's Finish of pc and what follows it.
	finish := func(ri int, pc piece) {
		room := pc.room
		call := time.Now()
		res, err := ranks[ri].eng.Finish(stop.finishCtx(), uint64(room))
		ret := time.Now()
		if finished(res.Status, err) {
			side.landed(ri, pc)
		}
		col.mu.Lock()
		col.finishes = append(col.finishes, finishRec{room: room, forward: pc.forward, chunk: res.Chunk, call: call, ret: ret, status: res.Status, stats: res.Stats,
			ok: finished(res.Status, err)})
		if err != nil {
			mr.Failed++
			if mr.FirstError == "" {
				mr.FirstError = err.Error()
				if g.sharded {
					mr.FirstError = fmt.Sprintf("prefill TP rank %d: %v", ri, err)
				}
			}
		}
		col.mu.Unlock()
		var after func()
		if pc.last {
			after = func() { rs.finished(room) }
		}
		key := [2]int{room, pc.start}
		mu.Lock()
		o := left[key]
		if o == nil {
			o = newOutcome(len(ranks))
			left[key] = o
		}
		o.add(res, err)
		last := o.left == 0
		if last {
			delete(left, key)
			if nt != nil {
				// Queued under the lock: the chunks of a room reach the
				// notifier in order whichever rank ends each.
				nt.notify(room, notice(p, pc, o.result()), after)
			}
		}
		mu.Unlock()
		if last && nt != nil {
			return // the notice releases this rank's share of the slot
		}
		if last {
			side.ChunkDone(notice(p, pc, o.result()))
		}
		if after != nil {
			after()
		}
	}
	// A slot's next request is admitted only once this one's chunks are
	// all finished, so one request's chunks are all it ever queues.
	return newWorkers(p.resident, len(ranks), p.maxChunks, finish, nt)
}

// workers are the goroutines that call Finish, one per slot and prefill
// rank.
type workers struct {
	slots   [][]chan piece // by slot, then rank
	pending sync.WaitGroup // pieces handed over and not finished
	exited  sync.WaitGroup
	nt      *notifier
}

// newWorkers starts a worker per slot and rank, each calling finish on the
// pieces handed to it, in order; depth is how many a worker queues.
func newWorkers(resident, ranks, depth int, finish func(ri int, pc piece), nt *notifier) *workers {
	ws := &workers{slots: make([][]chan piece, resident), nt: nt}
	for slot := range ws.slots {
		for ri := range ranks {
			ch := make(chan piece, depth)
			ws.slots[slot] = append(ws.slots[slot], ch)
			ws.exited.Add(1)
			go func() {
				defer ws.exited.Done()
				for pc := range ch {
					finish(ri, pc)
					ws.pending.Done()
				}
			}()
		}
	}
	return ws
}

// hand gives pc to its slot's worker on every rank.
func (ws *workers) hand(pc piece) {
	for _, ch := range ws.slots[pc.room%len(ws.slots)] {
		ws.pending.Add(1)
		ch <- pc
	}
}

// drain waits until every piece handed over is finished.
func (ws *workers) drain() { ws.pending.Wait() }

// stop ends the workers once what they were handed is finished.
func (ws *workers) stop() {
	for _, chs := range ws.slots {
		for _, ch := range chs {
			close(ch)
		}
	}
	ws.exited.Wait()
	if ws.nt != nil {
		ws.nt.close()
	}
}

// chunkOutcome gathers the prefill ranks' Finish results of one chunk.
type chunkOutcome struct {
	left  int           // ranks still to finish it
	ok    bool          // every rank's Finish so far succeeded
	fail  system.Result // the first rank's that did not
	bytes uint64
}

func newOutcome(ranks int) *chunkOutcome { return &chunkOutcome{left: ranks, ok: true} }

func (o *chunkOutcome) add(res system.Result, err error) {
	o.left--
	o.bytes += res.Stats.Bytes
	if o.ok && (err != nil || res.Status != system.Succeeded) {
		o.ok, o.fail = false, res
		if o.fail.Err == nil {
			o.fail.Err = err
		}
		if o.fail.Status == system.Succeeded {
			o.fail.Status = system.Failed
		}
	}
}

// result is the chunk's outcome on every prefill rank together: what the
// decode ranks are told once the last rank's Finish returned.
func (o *chunkOutcome) result() system.Result {
	r := system.Result{Status: system.Succeeded}
	if !o.ok {
		r = o.fail
	}
	r.Stats.Bytes = o.bytes
	return r
}
