package workload

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/stallprobe"
	"github.com/kvstream/kvstream/lab/testbed"
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
	plan, err := newPlan(cfg, g)
	if err != nil {
		return nil, err
	}
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
	// How long the machine kept this process from running during the
	// runs: the verdict's evidence that figures may be high.
	probe := stallprobe.Start()
	defer probe.Close()
	from := time.Now()
	for _, perLayer := range []bool{true, false} {
		progress := func() {
			done++
			if cfg.Progress != nil {
				cfg.Progress(done, total)
			}
		}
		mr, err := runRig(ctx, cfg, g, plan, perLayer, log, progress, localSide(cfg, g, plan))
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
	rep.Verdict = newVerdict(rep, probe.Stalled(from, time.Now()))
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
	// positions are, per request, the positions this CP rank sends: its
	// pieces' positions, in order.
	positions [][]int
}

// src and dst are request room's prefill and decode pages, by position.
func (p *plan) src(room int) []int { return p.slotSrc[room%p.resident] }
func (p *plan) dst(room int) []int { return p.slotDst[room%p.resident] }

// owned is the set of room's positions this CP rank sends.
func (p *plan) owned(room int) map[int]bool {
	out := make(map[int]bool, len(p.positions[room]))
	for _, x := range p.positions[room] {
		out[x] = true
	}
	return out
}

// newPlan splits each prompt into page-aligned chunks under the forward's
// token budget (chunked prefill: requests in order, a request may span
// forwards) and allocates the resident requests' pages the way a paged
// pool does: mostly consecutive runs, in shuffled order. Each piece's
// positions are computed here, once: the decode notices, the oracles and
// the floors use them.
func newPlan(cfg Config, g geometry) (*plan, error) {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b7673))
	p := &plan{resident: g.resident, pool: g.pagesPerRequest * g.resident}
	p.slotSrc = allocate(rng, p.pool, g.pagesPerRequest, g.resident)
	p.slotDst = allocate(rng, p.pool, g.pagesPerRequest, g.resident)
	next := make([]int, cfg.Requests)
	p.chunks = make([]int, cfg.Requests)
	p.positions = make([][]int, cfg.Requests)
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
			var err error
			if pc.rng, err = cp.ChunkRange(pc.start, pc.end, cfg.PageSize, last); err != nil {
				return nil, errors.Wrapf(err, "request %d chunk %d-%d", r, pc.start, pc.end)
			}
			owned, pos, err := cfg.CP.Owned(p.src(r)[pc.rng.PageStart:pc.rng.PageStart+pc.rng.Pages], pc.rng.PageStart, g.pagesPerRequest)
			if err != nil {
				return nil, errors.Wrapf(err, "request %d chunk %d-%d", r, pc.start, pc.end)
			}
			pc.owned, pc.positions = len(owned), pos
			p.positions[r] = append(p.positions[r], pos...)
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
	return p, nil
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
	if g.sharded {
		if _, ok := dp.(ShardedPlane); !ok {
			return nil, errors.Mark(errors.Newf("%s: this decode side (%T) does not shard", cfg.tpFlags(), dp), system.ErrBadInput)
		}
	}
	if log == nil {
		log = zap.NewNop()
	}
	plan, err := newPlan(cfg, g)
	if err != nil {
		return nil, err
	}
	done := 0
	progress := func() {
		done++
		if cfg.Progress != nil {
			cfg.Progress(done, len(plan.forwards))
		}
	}
	return runRig(ctx, cfg, g, plan, perLayer, log, progress, &remotePlane{dp: dp, cfg: cfg, g: g, p: plan})
}
