package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// Run runs the workload per layer, then monolithically, and reports both.
func Run(ctx context.Context, cfg Config, log *zap.Logger) (*Report, error) {
	cfg, choice, err := cfg.resolveGroup()
	if err != nil {
		return nil, err
	}
	g, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	plan := newPlan(cfg, g)
	rep := newReport(cfg, g, plan)
	rep.GroupAuto = choice
	// Warm the modeled link's staging buffers for the largest batch (a whole
	// chunk, monolithic) before anything is timed.
	// A forward never holds more than one prompt's worth of a request, and
	// both are bounded (checkBounds), so this product stays small.
	chunkPages := min(cfg.ChunkTokens, cfg.PromptTokens*cfg.Requests)/cfg.PageSize + 1
	loopback.Prewarm(uint64(g.itemLen)*uint64(chunkPages)*uint64(g.buffers), 2*cfg.Submitters)
	total := 2 * len(plan.forwards)
	done := 0
	for _, perLayer := range []bool{true, false} {
		progress := func() {
			done++
			if cfg.Progress != nil {
				cfg.Progress(done, total)
			}
		}
		var mr *ModeReport
		if g.sharded {
			mr, err = runSharded(ctx, cfg, g, plan, perLayer, log, progress, nil)
		} else {
			mr, err = runMode(ctx, cfg, g, plan, perLayer, log, progress, &localPlane{cfg: cfg, g: g, p: plan})
		}
		if err != nil {
			return nil, err
		}
		if mr.Failed > 0 {
			return nil, errors.Newf("%s run: %d chunks failed: %s", mr.mode(), mr.Failed, mr.FirstError)
		}
		if mr.Aborted != "" {
			// The sim compares whole runs: one stopped early has no report.
			return nil, errors.Newf("%s run stopped: %s (%d of %d forwards, %d requests done)", mr.mode(), mr.Aborted, mr.ForwardsDone, len(plan.forwards), mr.RequestsDone)
		}
		if perLayer {
			rep.PerLayer = mr
		} else {
			rep.Monolithic = mr
		}
	}
	rep.finish()
	return rep, nil
}

// piece is what one forward writes of one request.
type piece struct {
	room       int
	forward    int // index in plan.forwards
	start, end int // tokens
	last       bool
	rng        cp.Range
	owned      int   // pages this CP rank sends
	positions  []int // their absolute positions in the request, computed once here
}

// plan is the schedule and the page allocation shared by both modes.
type plan struct {
	forwards [][]piece
	// slotSrc and slotDst are, per slot, the prefill and decode page of
	// each position: request r holds slot r % resident (see residency).
	slotSrc, slotDst [][]int
	resident         int
	pool             int   // pages per buffer on each side
	chunks           []int // per request: how many pieces (chunks) it has
	maxChunks        int
}

// src and dst are request room's prefill and decode pages, by position.
func (p *plan) src(room int) []int { return p.slotSrc[room%p.resident] }
func (p *plan) dst(room int) []int { return p.slotDst[room%p.resident] }

// newPlan splits each prompt into page-aligned chunks under the forward's
// token budget (chunked prefill: requests in order, a request may span
// forwards) and allocates the resident requests' pages the way a paged
// pool does: mostly consecutive runs, in shuffled order.
func newPlan(cfg Config, g geometry) *plan {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b7673))
	p := &plan{resident: g.resident, pool: g.pagesPerRequest * g.resident}
	p.slotSrc = allocate(rng, p.pool, g.pagesPerRequest, g.resident)
	p.slotDst = allocate(rng, p.pool, g.pagesPerRequest, g.resident)
	next := make([]int, cfg.Requests)
	p.chunks = make([]int, cfg.Requests)
	for r := 0; r < cfg.Requests; {
		budget := cfg.ChunkTokens
		var fw []piece
		for ; r < cfg.Requests && budget > 0; r++ {
			take := min(cfg.PromptTokens-next[r], budget)
			last := next[r]+take == cfg.PromptTokens
			if !last {
				take -= take % cfg.PageSize
			}
			if take == 0 {
				break
			}
			pc := piece{room: r, forward: len(p.forwards), start: next[r], end: next[r] + take, last: last}
			pc.rng, _ = cp.ChunkRange(pc.start, pc.end, cfg.PageSize, last)
			owned, pos, _ := cfg.CP.Owned(p.src(r)[pc.rng.PageStart:pc.rng.PageStart+pc.rng.Pages], pc.rng.PageStart, g.pagesPerRequest)
			pc.owned, pc.positions = len(owned), pos
			fw = append(fw, pc)
			p.chunks[r]++
			p.maxChunks = max(p.maxChunks, p.chunks[r])
			budget -= take
			next[r] += take
			if !last {
				break // the budget is spent mid-request
			}
		}
		p.forwards = append(p.forwards, fw)
	}
	return p
}

func allocate(rng *rand.Rand, pool, per, requests int) [][]int {
	const run = 16
	blocks := rng.Perm((pool + run - 1) / run)
	pages := make([]int, 0, pool)
	for _, b := range blocks {
		for pg := b * run; pg < min((b+1)*run, pool); pg++ {
			pages = append(pages, pg)
		}
	}
	out := make([][]int, requests)
	for r := range out {
		out[r] = pages[r*per : (r+1)*per]
	}
	return out
}

// collector observes one mode's run.
type collector struct {
	system.NopObserver
	mu       sync.Mutex
	batches  []system.Batch
	kernels  map[string]sim.Span // by name; the latest end when several streams run it
	byStream map[string]map[string]sim.Span
	order    []string
	finishes []finishRec
}

type finishRec struct {
	room      int
	forward   int // the chunk's forward (plan.forwards)
	chunk     system.Chunk
	call, ret time.Time
	status    system.Status
	stats     system.ChunkStats
	ok        bool // the Finish succeeded
}

func (c *collector) Batch(b system.Batch) {
	c.mu.Lock()
	c.batches = append(c.batches, b)
	c.mu.Unlock()
}
func (c *collector) Chunk(system.Result) {}
func (c *collector) span(s sim.Span) {
	c.mu.Lock()
	if old, ok := c.kernels[s.Name]; !ok || s.End.After(old.End) {
		if !ok {
			c.order = append(c.order, s.Name)
		}
		c.kernels[s.Name] = s
	}
	if c.byStream != nil {
		if c.byStream[s.Stream] == nil {
			c.byStream[s.Stream] = map[string]sim.Span{}
		}
		c.byStream[s.Stream][s.Name] = s
	}
	c.mu.Unlock()
}

// streamKernel is the span of one stream's kernel (a sharded run).
func (c *collector) streamKernel(stream, name string) (sim.Span, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.byStream[stream][name]
	return s, ok
}

func (c *collector) kernel(name string) (sim.Span, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.kernels[name]
	return s, ok
}

// runMode runs the whole schedule on a fresh engine, GPU and prefill pool,
// with the decode side dp provides.
func runMode(ctx context.Context, cfg Config, g geometry, p *plan, perLayer bool, log *zap.Logger, progress func(), dp DataPlane) (_ *ModeReport, err error) {
	col := &collector{kernels: map[string]sim.Span{}}
	geom := testbed.MLA(g.layers, uint64(g.itemLen), p.pool)
	if !cfg.Preset.MLA {
		geom = testbed.KV(g.layers, uint64(g.itemLen), p.pool)
	}
	pre, peer, err := dp.Open(geom, cfg.Seed, log)
	if err != nil {
		return nil, err
	}
	defer dp.Close()
	pool, err := testbed.NewPool(geom)
	if err != nil {
		return nil, errors.Wrapf(err, "prefill pool of %d MiB", len(geom.Layers)*g.itemLen*p.pool>>20)
	}
	defer pool.Free()
	fill(pool.Block.Bytes, staleByte) // stale KV: a read before the write would copy this
	gpu := sim.New(sim.Options{TimeScale: cfg.TimeScale, OnSpan: col.span, Precise: true})
	defer gpu.Close()
	stream := gpu.NewStream("compute")
	bufs := pool.EngineBuffers()
	if cfg.plant != nil {
		cfg.plant(bufs)
	}
	ecfg := system.Config{
		Buffers: bufs, HookLayers: g.hookLayers, GroupSize: cfg.GroupSize, PageSize: cfg.PageSize,
		CP: cfg.CP, Submitters: cfg.Submitters, FinishTimeout: cfg.FinishTimeout, DisablePerLayer: !perLayer,
	}
	if cfg.autoModel != nil {
		ecfg.GroupSize, ecfg.AutoGroup = 0, cfg.autoModel
	}
	eng, err := system.New(ecfg, engineOptions(cfg, perLayer, system.WithStream(stream), system.WithTransport(pre), system.WithObserver(col), system.WithLogger(log))...)
	if err != nil {
		return nil, err
	}
	defer func() {
		// Close writes the message trace (--record): a trace that could not
		// be written is the run's error, not a silent empty file.
		if cerr := eng.Close(); cerr != nil && err == nil {
			err = errors.Wrap(cerr, "close the engine")
		}
	}()
	if k := eng.GroupSize(); k != cfg.GroupSize {
		_ = eng.Close()
		return nil, errors.AssertionFailedf("the engine runs K = %d, the sim's floor assumes %d", k, cfg.GroupSize)
	}
	if err := eng.AddPeer(peer); err != nil {
		return nil, err
	}
	if lost, ok := dp.(interface{ OnPeerLost(func(error)) }); ok {
		lost.OnPeerLost(func(cause error) { eng.PeerLost(peer.ID, cause) })
	}
	usPerKTok := cfg.Preset.LayerUsPerKTok
	if cfg.LayerUsPerKTok > 0 {
		usPerKTok = cfg.LayerUsPerKTok
	}
	model := &testbed.Model{Stream: stream, Pool: pool, HookLayers: g.hookLayers, Seed: cfg.Seed,
		LayerTime: func(tokens int) time.Duration {
			return time.Duration(float64(tokens) / 1000 * usPerKTok * float64(time.Microsecond))
		}}

	// One transfer worker per slot finishes its request's chunks in send
	// order, as soon as each chunk's forward ended; the forward loop never
	// waits for it, except for a slot (see residency).
	mr := &ModeReport{PerLayer: perLayer, Forwards: len(p.forwards)}
	rel, _ := dp.(releaser)
	if rel != nil {
		rel.Prefill(pool)
	}
	rs := newResidency(p, cfg.Requests, 1, func(room int) {
		if rel != nil {
			rel.Release(room, pool)
		}
		restale(pool, p.src(room))
	})
	// The in-process decode side (a releaser) checks a chunk's pages the
	// moment its Finish returned (a write landing later shows then);
	// another process is told through a notifier, off the worker.
	var nt *notifier
	if rel == nil {
		nt = newNotifier(p.resident, p.maxChunks, dp.ChunkDone)
	}
	stop := newStopper(ctx, cfg.Drain, cfg.Requests)
	work := make([]chan piece, p.resident)
	var wg sync.WaitGroup
	for s := range work {
		// A slot's next request is admitted only once this one's chunks are
		// all finished, so one request's chunks are all it ever queues.
		work[s] = make(chan piece, p.maxChunks)
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			for pc := range work[s] {
				call := time.Now()
				res, err := eng.Finish(stop.finishCtx(), uint64(pc.room))
				ret := time.Now()
				col.mu.Lock()
				col.finishes = append(col.finishes, finishRec{room: pc.room, forward: pc.forward, chunk: res.Chunk, call: call, ret: ret, status: res.Status, stats: res.Stats,
					ok: finished(res.Status, err)})
				if err != nil {
					mr.Failed++
					if mr.FirstError == "" {
						mr.FirstError = err.Error()
					}
				}
				col.mu.Unlock()
				var after func()
				if pc.last {
					room := pc.room
					after = func() { rs.finished(room) }
				}
				if nt != nil {
					nt.notify(pc.room, notice(cfg, g, p, pc, res), after)
					continue
				}
				dp.ChunkDone(notice(cfg, g, p, pc, res))
				if after != nil {
					after()
				}
			}
		}(s)
	}

	// The loop runs one forward ahead of the GPU: forward k is enqueued
	// (and its chunks handed to their workers, whose Finish waits for its
	// end) once forward k-1's first kernel ended, so that at a forward's
	// end the next one is already queued and this loop's host work
	// (registering, enqueueing some sixty kernels: tenths of a millisecond
	// on two cores) is not in the window where that forward's last batches
	// land. On a serving host the forward loop has its own core.
	t0 := time.Now()
	launched := 0 // forwards enqueued
	ended := 0    // forwards known to have ended (and told to Progress)
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
		writes := make([]testbed.Write, 0, len(fw))
		for _, pc := range fw {
			spec := system.ChunkSpec{Room: uint64(pc.room), Start: pc.start, End: pc.end, Last: pc.last,
				SrcPages: p.src(pc.room)[pc.rng.PageStart : pc.rng.PageStart+pc.rng.Pages], TotalPages: g.pagesPerRequest,
				Infos: []system.DecodeInfo{{Peer: peer.ID, DstPages: p.dst(pc.room)}}}
			if rel != nil {
				rel.expect(pc) // before any of its batches can be posted
			}
			if _, err := eng.Register(ctx, spec); err != nil {
				// The decode side was lost (or refused): stop scheduling, let
				// what is registered finish (or fail), and report.
				mr.Aborted = errors.Wrapf(err, "forward %d", k+1).Error()
				break forwards
			}
			writes = append(writes, testbed.Write{Room: uint64(pc.room), PageStart: pc.rng.PageStart, SrcPages: spec.SrcPages, Tokens: pc.end - pc.start})
		}
		if started, loopErr = model.ForwardMarked(eng, writes); loopErr != nil {
			loopErr = errors.Wrapf(loopErr, "forward %d", k+1)
			break
		}
		launched++
		for _, pc := range fw {
			work[pc.room%p.resident] <- pc
		}
	}
	if loopErr == nil {
		sctx, cancel := stop.syncCtx()
		loopErr = stream.Synchronize(sctx)
		cancel()
		for ; loopErr == nil && ended < launched; ended++ {
			progress()
		}
	}
	// A run that stopped early is not summarized: no forward ends needed.
	var forwardEnds []time.Time
	if !skipped && mr.Aborted == "" {
		forwardEnds = make([]time.Time, launched)
	}
	for k := range forwardEnds {
		if loopErr != nil {
			break
		}
		end, ok := col.kernel(testbed.KernelName(k+1, g.layers-1))
		if !ok {
			loopErr = errors.AssertionFailedf("forward %d: no span for its last kernel", k+1)
			break
		}
		forwardEnds[k] = end.End
	}
	// The workers end once every chunk handed to them is finished (each
	// Finish is bounded), also when the loop stopped early.
	for _, w := range work {
		close(w)
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
	mr.countDone(p, col, launched, 1)
	if mr.NotStarted = stop.drained(); mr.NotStarted > 0 && mr.Aborted == "" {
		mr.Aborted = fmt.Sprintf("drained: %d of %d requests not started", mr.NotStarted, cfg.Requests)
	}
	if mr.Aborted != "" {
		mr.moved(col, launched)
		return mr, nil
	}
	mr.mismatch = dp.Verify(pool)
	mr.summarize(cfg, g, p, col, t0, forwardEnds)
	if rel != nil {
		mr.oracle = append(rel.violations(), mr.oracle...)
	}
	return mr, nil
}

func engineOptions(cfg Config, perLayer bool, base ...system.Option) []system.Option {
	opts := append(base, cfg.EngineOptions...)
	if perLayer && cfg.Record != nil {
		opts = append(opts, system.WithTrace(cfg.Record, 0))
	}
	if cfg.PerMode != nil {
		opts = append(opts, cfg.PerMode(perLayer)...)
	}
	return opts
}

// restale puts the stale bytes back into a released request's prefill
// pages, so that an early read of the next request shows as such.
func restale(pool *testbed.Pool, pages []int) {
	for _, pg := range pages {
		for b := 0; b < pool.Buffers(); b++ {
			fill(pool.Page(b, pg), staleByte)
		}
	}
}

// staleByte fills the prefill pool before the run: what a read of a page
// before its kernel started would copy.
const staleByte = 0xEE

// fill sets every byte of b to v, by doubling copies (a byte loop over a
// few hundred MB takes seconds).
func fill(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for n := 1; n < len(b); n *= 2 {
		copy(b[n:], b[:n])
	}
}

// RunRemote runs the workload once, per layer (or monolithically), with
// the decode side dp (another process): no modeled link, the transport is
// real. A sharded configuration needs dp to be a ShardedPlane: every
// prefill (stage, rank) engine runs here, as in the sim, and writes into
// the decode ranks dp opens. A lost decode side stops the run early
// (Aborted) instead of failing it, so that the caller reports what
// happened.
func RunRemote(ctx context.Context, cfg Config, log *zap.Logger, dp DataPlane, perLayer bool) (*ModeReport, error) {
	g, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	var remote ShardedPlane
	if g.sharded {
		var ok bool
		if remote, ok = dp.(ShardedPlane); !ok {
			return nil, errors.Mark(errors.Newf("%s: this decode side (%T) does not shard", cfg.tpFlags(), dp), system.ErrBadInput)
		}
	}
	if log == nil {
		log = zap.NewNop()
	}
	plan := newPlan(cfg, g)
	done := 0
	progress := func() {
		done++
		if cfg.Progress != nil {
			cfg.Progress(done, len(plan.forwards))
		}
	}
	if remote != nil {
		return runSharded(ctx, cfg, g, plan, perLayer, log, progress, remote)
	}
	return runMode(ctx, cfg, g, plan, perLayer, log, progress, dp)
}
