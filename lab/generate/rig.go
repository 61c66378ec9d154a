package generate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/cuda/cpu"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/landguard"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// staleByte fills the prefill pools before a run: a float32 of -3.7e28, so
// that a read of KV nobody wrote (a page a CP rank does not own, a slot
// past the prompt) wrecks the logits rather than passing unnoticed.
const staleByte = 0xEE

// request is one prompt the rig prefills and transfers, into decode pages
// dst (request page -> decode page, the same on every decode rank).
// Locally, requests run one after the other on the same pages and only the
// last one is decoded; to another process, each has pages of its own.
type request struct {
	room   uint64
	prompt []int
	dst    []int
}

// rank is one prefill rank: its engine, its pool and where it sits.
type rank struct {
	c, st, tp int
	eng       *system.Engine
	pool      *testbed.Pool
	routes    []*reshard.Route // to every decode rank it feeds (for the floor)
	work      chan chunkJob
	guard     *landguard.Guard // its transport as its engine sees it (nil to another process)
}

// chunkJob is a chunk a rank's transfer worker finishes: start is the
// range's start the engine registered.
type chunkJob struct {
	req, k, start int
	room          uint64
}

// finish is one Finish's outcome.
type finish struct {
	rank, req, k int
	res          system.Result
	err          error
	ret          time.Time
}

// chunk is one forward of a request: tokens [a, b), registered as rng.
type chunk struct {
	a, b int
	rng  cp.Range
}

// modeRun is what one mode's run produced.
type modeRun struct {
	first      tinylm.Step        // the prefill's pick
	gen        tinylm.Generation  // decoded from the transferred KV
	ref        *tinylm.Generation // decoded collocated on the prefill's pools (when asked)
	bytesEqual bool
	mismatch   string
	transport  []string // what the transport oracle caught
	exposed    time.Duration
	floor      time.Duration
	fwdEnd     time.Time // the end of the request's last forward on the streams
	phases     Phases
	forward    time.Duration // the request's forwards on the streams: first kernel start to last kernel end
	bytes      uint64
	batches    int
}

// rig is one run's fixed parts.
type rig struct {
	cfg    Config
	g      geometry
	m      *tinylm.Model
	chunks []chunk
	src    []int // request page -> prefill page, the same on every prefill rank
	dst    []int // request page -> decode page, the same on every decode rank (local runs)
	log    *zap.Logger
}

func newRig(cfg Config, g geometry, m *tinylm.Model, log *zap.Logger) (*rig, error) {
	r := &rig{cfg: cfg, g: g, m: m, log: log}
	ps := cfg.PageSize
	for a := 0; a < cfg.PromptTokens; a += cfg.ChunkTokens {
		b := min(a+cfg.ChunkTokens, cfg.PromptTokens)
		// The previous chunk registered up to its page-floored end: this
		// one starts there (its forward wrote the tokens before a).
		rng, err := cp.ChunkRange(a/ps*ps, b, ps, b == cfg.PromptTokens)
		if err != nil {
			return nil, err
		}
		r.chunks = append(r.chunks, chunk{a: a, b: b, rng: rng})
	}
	// Scattered page tables (runs of consecutive pages break), drawn from
	// the seed.
	rnd := rand.New(rand.NewPCG(cfg.Seed, 0x6A09E667F3BCC908))
	r.src = rnd.Perm(g.poolPages)[:g.reqPages]
	r.dst = rnd.Perm(g.poolPages)[:g.reqPages]
	return r, nil
}

// owner is the CP rank that holds request page p: the rule's, over the
// prompt's pages; the pages of generated tokens (which only the collocated
// reference writes) follow the shared rule.
func (r *rig) owner(p int) int {
	n, T := r.cfg.CP, r.g.promptPages
	if r.cfg.CPRule == cp.Contiguous && p < T {
		for c := 0; c < n; c++ {
			if _, hi, _ := cp.ContiguousSlice(T, n, c); p < hi {
				return c
			}
		}
	}
	return p % n
}

func geometryOf(s *reshard.Side, st, pages int) testbed.Geometry {
	lo, hi := s.StageLayers(st)
	if s.MLA {
		return testbed.MLA(hi-lo, s.ItemLen(), pages)
	}
	return testbed.KV(hi-lo, s.ItemLen(), pages)
}

// collector keeps the streams' kernel spans by name.
type collector struct {
	mu    sync.Mutex
	spans map[string]cpu.Span
}

func (c *collector) span(s cpu.Span) {
	c.mu.Lock()
	c.spans[s.Name] = s
	c.mu.Unlock()
}

func (c *collector) get(name string) (cpu.Span, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.spans[name]
	return s, ok
}

func kernelName(req, k, l int) string { return fmt.Sprintf("r%d c%d L%d", req, k, l) }

// prefill is the prefill side of a run, wherever its decode side is: one
// CPU stream per PP stage, shared by the stage's engines (its TP ranks
// compute together, its CP ranks the same layers); one engine and pool per
// (CP rank, PP stage, TP rank); the prefill's view of a request's KV (per
// stage and TP rank a cache whose pages live in their owning CP rank's
// pool); and one transfer worker per rank that finishes its chunks in send
// order onto finishes.
type prefill struct {
	r        *rig
	streams  []*cpu.Stream
	ranks    []*rank
	caches   [][]*tinylm.Cache
	col      *collector
	peers    []string // every decode rank's peer id: each chunk's destinations
	finishes chan finish
	wg       sync.WaitGroup

	kmu       sync.Mutex
	kernelErr error // the first model kernel's error
}

// newPrefill builds the prefill side: transport gives each rank its
// transport (by the rank's name), peers are the decode ranks (stage-major,
// each with its Sharding), perLayer the mode. What it builds is closed by
// cleanup (run in reverse), its workers by stop.
func (r *rig) newPrefill(ctx context.Context, transport func(name string) (rdma.Transport, error), peers []system.Peer,
	perLayer bool, cleanup *[]func()) (*prefill, error) {
	cfg, g := &r.cfg, &r.g
	p := &prefill{r: r, col: &collector{spans: map[string]cpu.Span{}}}
	for _, peer := range peers {
		p.peers = append(p.peers, peer.ID)
	}
	p.streams = make([]*cpu.Stream, g.pre.PP())
	for st := range p.streams {
		s := cpu.NewStream(fmt.Sprintf("prefill-pp%d", st), cpu.Options{OnSpan: p.col.span})
		p.streams[st] = s
		*cleanup = append(*cleanup, s.Close)
	}
	byPlace := map[[3]int]*rank{}
	for c := 0; c < cfg.CP; c++ {
		for st := 0; st < g.pre.PP(); st++ {
			for tp := 0; tp < g.pre.TP; tp++ {
				tr, err := transport(fmt.Sprintf("prefill-cp%d-pp%d-tp%d", c, st, tp))
				if err != nil {
					return nil, err
				}
				rk, err := r.newRank(tr, p.streams[st], peers, c, st, tp, perLayer, cleanup)
				if err != nil {
					return nil, errors.Wrapf(err, "prefill CP rank %d PP stage %d TP rank %d", c, st, tp)
				}
				rk.guard, _ = tr.(*landguard.Guard) // a local run's: the oracle's
				p.ranks = append(p.ranks, rk)
				byPlace[[3]int{c, st, tp}] = rk
			}
		}
	}
	p.caches = make([][]*tinylm.Cache, g.pre.PP())
	for st := range p.caches {
		for tp := 0; tp < g.pre.TP; tp++ {
			cache := &tinylm.Cache{Side: g.pre, Rank: reshard.Rank{TP: tp, Stage: st}}
			for pg, src := range r.src {
				cache.Pages = append(cache.Pages, tinylm.PageRef{Pool: byPlace[[3]int{r.owner(pg), st, tp}].pool, Page: src})
			}
			p.caches[st] = append(p.caches[st], cache)
		}
	}
	p.finishes = make(chan finish, len(p.ranks)*len(r.chunks))
	for i, rk := range p.ranks {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for j := range rk.work {
				res, err := rk.eng.Finish(ctx, j.room)
				ret := time.Now()
				if err == nil && res.Status == system.Succeeded && rk.guard != nil {
					rk.guard.Finished(int(j.room), j.start)
				}
				p.finishes <- finish{rank: i, req: j.req, k: j.k, res: res, err: err, ret: ret}
			}
		}()
	}
	return p, nil
}

// stop ends the transfer workers once they finished what they were given;
// a second call does nothing.
func (p *prefill) stop() {
	for _, rk := range p.ranks {
		if rk.work != nil {
			close(rk.work)
			rk.work = nil
		}
	}
	p.wg.Wait()
}

// sync waits for every stream, then returns the first model kernel's
// error, if any.
func (p *prefill) sync(ctx context.Context) error {
	for _, s := range p.streams {
		if err := s.Synchronize(ctx); err != nil {
			return errors.Wrapf(err, "stream %s", s.Name())
		}
	}
	p.kmu.Lock()
	defer p.kmu.Unlock()
	return errors.Wrap(p.kernelErr, "model kernel")
}

// runMode runs the requests through fresh engines, streams and pools in
// one mode, checks the last request's bytes, and decodes it from the
// decode pools (and, with reference, collocated on the prefill's).
func (r *rig) runMode(ctx context.Context, perLayer, reference bool, reqs []request) (_ *modeRun, err error) {
	cfg, g := &r.cfg, &r.g
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	fab := loopback.NewFabric(loopback.Options{Bandwidth: cfg.LinkGbps * 1e9 / 8, Latency: cfg.LinkLatency, Precise: true})

	// The decode side: one pool per (stage, TP rank), each a peer.
	var decPools [][]*testbed.Decode
	var peers []system.Peer
	for st := 0; st < g.dec.PP(); st++ {
		decPools = append(decPools, nil)
		for d := 0; d < g.dec.TP; d++ {
			name := fmt.Sprintf("decode-pp%d-tp%d", st, d)
			tr, err := fab.NewTransport(name)
			if err != nil {
				return nil, err
			}
			cleanup = append(cleanup, func() { _ = tr.Close() })
			pool, err := testbed.NewDecode(tr, geometryOf(&g.dec, st, g.poolPages))
			if err != nil {
				return nil, errors.Wrapf(err, "decode PP stage %d TP rank %d pool", st, d)
			}
			cleanup = append(cleanup, func() { _ = pool.Free() })
			decPools[st] = append(decPools[st], pool)
			peer := pool.Peer(name)
			peer.Sharding = &system.Sharding{Side: g.dec, Rank: reshard.Rank{TP: d, Stage: st}}
			peers = append(peers, peer)
		}
	}
	if cfg.Plant == PlantHeadsSwapped {
		peers[0].Sharding.Rank, peers[1].Sharding.Rank = peers[1].Sharding.Rank, peers[0].Sharding.Rank
	}
	var flat []*testbed.Decode // by peer: stage-major
	for _, ps := range decPools {
		flat = append(flat, ps...)
	}
	oracle := landguard.New(landguard.NewPools(flat, func(d landguard.Dest) string {
		return fmt.Sprintf("%s of decode PP stage %d TP rank %d", flat[d.Rank].Names[d.Buffer], d.Rank/g.dec.TP, d.Rank%g.dec.TP)
	}))

	// The prefill side, each rank on its own link of the fabric, below
	// the transport oracle.
	transport := func(name string) (rdma.Transport, error) {
		tr, err := fab.NewTransport(name)
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, func() { _ = tr.Close() })
		return oracle.Wrap(tr), nil
	}
	p, err := r.newPrefill(ctx, transport, peers, perLayer, &cleanup)
	if err != nil {
		return nil, err
	}
	defer p.stop() // on an early return; a no-op after the normal one

	var first tinylm.Step
	var results []finish
	for ri, rq := range reqs {
		last := ri == len(reqs)-1
		for k := range r.chunks {
			step, err := p.forward(ctx, ri, k, rq, last)
			if err != nil {
				return nil, err
			}
			if step != nil {
				first = *step
			}
			if cfg.Plant == PlantChunkPositions {
				// Each chunk registers as [0, its length): the previous
				// one, of the same key, must be finished first.
				for range p.ranks {
					results = append(results, <-p.finishes)
				}
			}
		}
		// A request's decode pages are reused by the next only once every
		// rank finished every chunk of it (what a decode side waits for
		// before it frees pages).
		for len(results) < (ri+1)*len(p.ranks)*len(r.chunks) {
			results = append(results, <-p.finishes)
		}
	}
	if err := p.sync(ctx); err != nil {
		return nil, err
	}
	p.stop()

	mr := &modeRun{first: first}
	var lastRet time.Time
	var lastStats system.ChunkStats // of the Finish that returned last
	lastReq, lastChunk := len(reqs)-1, len(r.chunks)-1
	for _, f := range results {
		if err := p.failed(f); err != nil {
			return nil, err
		}
		if f.req == lastReq {
			mr.bytes += f.res.Stats.Bytes
			mr.batches += f.res.Stats.Batches
			if f.k == lastChunk && f.ret.After(lastRet) {
				lastRet, lastStats = f.ret, f.res.Stats
			}
		}
	}
	if err := r.timing(mr, p.col, p.ranks, lastReq, lastRet, perLayer); err != nil {
		return nil, err
	}
	mr.phases = phases(mr.fwdEnd, lastStats, lastRet)

	// Bytes first (decoding writes the generated tokens' KV into the
	// pages), then tokens.
	mr.mismatch = r.checkBytes(p.ranks, decPools)
	mr.bytesEqual = mr.mismatch == ""
	mr.transport = oracle.Violations()
	pools := make([][]tinylm.Pool, len(decPools))
	for st, ps := range decPools {
		for _, p := range ps {
			pools[st] = append(pools[st], p)
		}
	}
	decCaches, err := tinylm.NewCaches(g.dec, pools, r.dst)
	if err != nil {
		return nil, err
	}
	if mr.gen, err = r.m.Generate(decCaches, cfg.PromptTokens, first.Token, cfg.NewTokens); err != nil {
		return nil, errors.Wrap(err, "decode")
	}
	if reference {
		ref, err := r.m.Generate(p.caches, cfg.PromptTokens, first.Token, cfg.NewTokens)
		if err != nil {
			return nil, errors.Wrap(err, "collocated reference decode")
		}
		mr.ref = &ref
	}
	return mr, nil
}

// failed is why a Finish did not succeed, naming the rank, request and
// chunk, or nil.
func (p *prefill) failed(f finish) error {
	rk := p.ranks[f.rank]
	switch {
	case f.err != nil:
		return errors.Wrapf(f.err, "prefill CP rank %d PP stage %d TP rank %d: request %d chunk %d", rk.c, rk.st, rk.tp, f.req, f.k)
	case f.res.Status != system.Succeeded:
		return errors.Newf("prefill CP rank %d PP stage %d TP rank %d: request %d chunk %d: %s: %v", rk.c, rk.st, rk.tp, f.req, f.k, f.res.Status, f.res.Err)
	}
	return nil
}

// newRank builds one prefill rank on transport tr: pool, engine, peers.
func (r *rig) newRank(tr rdma.Transport, stream *cpu.Stream, peers []system.Peer, c, st, tp int, perLayer bool, cleanup *[]func()) (*rank, error) {
	cfg, g := &r.cfg, &r.g
	pool, err := testbed.NewPool(geometryOf(&g.pre, st, g.poolPages))
	if err != nil {
		return nil, err
	}
	*cleanup = append(*cleanup, func() { _ = pool.Free() })
	fill(pool.Block.Bytes, staleByte)
	lo, hi := g.pre.StageLayers(st)
	ecfg := system.Config{
		Buffers: pool.EngineBuffers(), HookLayers: min(hi, g.hooks) - lo, GroupSize: cfg.GroupSize, PageSize: cfg.PageSize,
		CP: cp.CP{Size: cfg.CP, Rank: c, Rule: cfg.CPRule}, Submitters: cfg.Submitters, FinishTimeout: cfg.FinishTimeout,
		DisablePerLayer: !perLayer, Sharding: &system.Sharding{Side: g.pre, Rank: reshard.Rank{TP: tp, Stage: st}},
	}
	if cfg.Plant == PlantTPReplicasSend {
		ecfg.Sharding.Rank.TP = 0 // every replica takes itself for the one that sends
	}
	if cfg.Plant == PlantHooklessNotSent {
		// The serving stack registers only the buffers of hooked layers,
		// without a sharding (which would refuse the missing layer), and
		// describes the decode pool the same way.
		ecfg.Sharding = nil
		ecfg.Buffers = slices.DeleteFunc(ecfg.Buffers, func(b system.Buffer) bool { return b.Layer >= ecfg.HookLayers })
		unsharded := make([]system.Peer, len(peers))
		for i, p := range peers {
			p.Sharding = nil
			p.Buffers = slices.Clone(p.Buffers)
			for b := len(p.Buffers) - 1; b >= 0; b-- {
				if pool.Layers[b] >= ecfg.HookLayers {
					p.Buffers = slices.Delete(p.Buffers, b, b+1)
				}
			}
			unsharded[i] = p
		}
		peers = unsharded
	}
	eng, err := system.New(ecfg, system.WithStream(stream), system.WithTransport(tr), system.WithLogger(r.log))
	if err != nil {
		return nil, err
	}
	*cleanup = append(*cleanup, func() { _ = eng.Close() })
	for _, p := range peers {
		if err := eng.AddPeer(p); err != nil {
			return nil, err
		}
	}
	rk := &rank{c: c, st: st, tp: tp, eng: eng, pool: pool, work: make(chan chunkJob, 4*len(r.chunks))}
	pl, err := reshard.NewPlan(&reshard.Pairing{Prefill: g.pre, Decode: g.dec}, reshard.Rank{TP: tp, Stage: st})
	if err != nil {
		return nil, err
	}
	for i := range pl.Routes {
		if rt := &pl.Routes[i]; !rt.Empty() {
			rk.routes = append(rk.routes, rt)
		}
	}
	return rk, nil
}

// forward runs chunk k of request ri: registers it on every engine, then,
// stage by stage, enqueues one kernel per layer on the stage's stream and
// calls the stage's engines' LayerEnd after each hooked layer and End after
// the last, and hands the chunk to the transfer workers. With head, the
// last chunk also enqueues the head (the prefill's pick), returned once
// computed.
func (p *prefill) forward(ctx context.Context, ri, k int, rq request, head bool) (*tinylm.Step, error) {
	r := p.r
	cfg, g, ch := &r.cfg, &r.g, r.chunks[k]
	spec := r.spec(rq, k, p.peers)
	for _, rk := range p.ranks {
		if rk.guard != nil {
			positions, keys := r.expected(rq, k, len(p.peers))
			rk.guard.Expect(int(rq.room), spec.Start, spec.End, positions, keys)
		}
		if _, err := rk.eng.Register(ctx, spec); err != nil {
			return nil, errors.Wrapf(err, "request %d chunk %d: register on CP rank %d PP stage %d TP rank %d", ri, k, rk.c, rk.st, rk.tp)
		}
	}
	h, err := r.m.Embed(rq.prompt[ch.a:ch.b])
	if err != nil {
		return nil, err
	}
	rope := make([]int, len(h))
	for i := range rope {
		rope[i] = ch.a + i
		if cfg.Plant == PlantRoPEOffset && k > 0 {
			rope[i] -= cfg.ChunkTokens
		}
	}
	var step *tinylm.Step
	for st, s := range p.streams {
		lo, hi := g.pre.StageLayers(st)
		var stage []*rank
		for _, rk := range p.ranks {
			if rk.st == st {
				stage = append(stage, rk)
			}
		}
		fws := make([]*system.Forward, len(stage))
		for i, rk := range stage {
			if fws[i], err = rk.eng.BeginForward(); err != nil {
				return nil, err
			}
		}
		for l := lo; l < hi; l++ {
			run := func() {
				if err := r.m.Layer(l, h, ch.a, rope, p.caches[st]); err != nil {
					p.kmu.Lock()
					if p.kernelErr == nil {
						p.kernelErr = errors.Wrapf(err, "request %d chunk %d", ri, k)
					}
					p.kmu.Unlock()
				}
			}
			if err := s.Launch(cpu.Kernel{Name: kernelName(ri, k, l), Run: run}); err != nil {
				return nil, err
			}
			if l < g.hooks {
				for _, fw := range fws {
					if err := fw.LayerEnd(l - lo); err != nil {
						return nil, err
					}
				}
			}
		}
		for _, fw := range fws {
			if err := fw.End(); err != nil {
				return nil, err
			}
		}
		for _, rk := range stage {
			rk.work <- chunkJob{req: ri, k: k, start: spec.Start, room: rq.room}
		}
		if st == len(p.streams)-1 && head && k == len(r.chunks)-1 {
			step = new(tinylm.Step)
			last := h[len(h)-1]
			if err := s.Launch(cpu.Kernel{Name: "head", Run: func() { *step = tinylm.Pick(r.m.Logits(last)) }}); err != nil {
				return nil, err
			}
		}
		if st < len(p.streams)-1 {
			// The next stage takes this one's hidden states.
			if err := s.Synchronize(ctx); err != nil {
				return nil, err
			}
		}
	}
	if step != nil {
		if err := p.streams[len(p.streams)-1].Synchronize(ctx); err != nil {
			return nil, err
		}
	}
	return step, nil
}

// spec is the registration of chunk k of a request on one rank, to every
// decode peer (with the plant's mistake, if any).
func (r *rig) spec(rq request, k int, peers []string) system.ChunkSpec {
	cfg, g, rng := &r.cfg, &r.g, r.chunks[k].rng
	dst := rq.dst[:g.promptPages]
	spec := system.ChunkSpec{Room: rq.room, Start: rng.Start, End: rng.End, Last: rng.Last,
		SrcPages: r.src[rng.PageStart : rng.PageStart+rng.Pages], TotalPages: g.promptPages}
	switch {
	case cfg.Plant == PlantChunkPositions:
		// The chunk's range counted from the chunk instead of the request
		// (positions from 0): its pages go where chunk 0's went.
		spec.Start, spec.End = 0, rng.End-rng.Start
	case cfg.Plant == PlantStalePage && k == 0 && rq.room == stalePlantRoom:
		spec.Start += cfg.PageSize
		spec.SrcPages = spec.SrcPages[1:]
	}
	for _, peer := range peers {
		spec.Infos = append(spec.Infos, system.DecodeInfo{Peer: peer, DstPages: dst})
	}
	return spec
}

// expected is what chunk k of rq must write, whatever a plant registers:
// its request positions and, for each, its decode page on each of the
// decode ranks (landguard keys, position-major).
func (r *rig) expected(rq request, k, ranks int) (positions, keys []int) {
	rng := r.chunks[k].rng
	for pos := rng.PageStart; pos < rng.PageStart+rng.Pages; pos++ {
		positions = append(positions, pos)
		for d := range ranks {
			keys = append(keys, landguard.PageKey(d, rq.dst[pos]))
		}
	}
	return positions, keys
}

// stalePlantRoom is the room of the request PlantStalePage plants in (the
// second; the first is the previous request, sent correctly).
const stalePlantRoom = 2

// fill sets every byte of b to v.
func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}
