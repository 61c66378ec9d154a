package generate

import (
	"sort"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/system"
)

// The ideal floor, as kvstream sim defines it (docs/PERFORMANCE.md, "The
// floor"), restated on the measured timeline of real compute: for the
// request, the instant an ideal sender with no overhead would have landed
// its last byte, minus the end of its last forward on the streams. The
// ideal sender sees each batch the moment its gating kernel ended (the
// group's last layer; the stage's last layer for the layers no hook covers
// and for a monolithic send) and puts it on its rank's link at once; each
// prefill rank has its own link (its own loopback node), which serves
// batches in that order, one after the other, each taking its bytes over
// the link rate, and a batch lands the link latency after its last byte
// left. Kernel ends are the CPU streams' spans, so the floor moves with
// the compute exactly as the measured exposed time does; an exposed time
// below it would be a measurement bug.

// linkBatch is one batch the ideal sender puts on a rank's link.
type linkBatch struct {
	req   int
	ready time.Time // its gating kernel's end
	bytes float64
	order int // generation order: ties in ready go in this order
}

// idealLandings returns, per batch (in the order given), the instant it
// lands on a link of bw bytes/s and the given latency.
func idealLandings(batches []linkBatch, bw float64, latency time.Duration) []time.Time {
	idx := make([]int, len(batches))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := batches[idx[a]], batches[idx[b]]
		if !x.ready.Equal(y.ready) {
			return x.ready.Before(y.ready)
		}
		return x.order < y.order
	})
	out := make([]time.Time, len(batches))
	var free time.Time // when the link's last byte left
	for _, i := range idx {
		b := batches[i]
		start := b.ready
		if free.After(start) {
			start = free
		}
		free = start.Add(time.Duration(b.bytes / bw * float64(time.Second)))
		out[i] = free.Add(latency)
	}
	return out
}

// timing sets the mode's forward time, exposed time and floor for the last
// request (lastReq), whose last Finish returned at lastRet.
func (r *rig) timing(mr *modeRun, col *collector, ranks []*rank, lastReq int, lastRet time.Time, perLayer bool) error {
	cfg, g := &r.cfg, &r.g
	end := func(req, k, l int) (time.Time, error) {
		s, ok := col.get(kernelName(req, k, l))
		if !ok {
			return time.Time{}, errors.AssertionFailedf("no span for request %d chunk %d layer %d", req, k, l)
		}
		return s.End, nil
	}
	lastChunk := len(r.chunks) - 1
	var fwdEnd time.Time
	for st := 0; st < g.pre.PP(); st++ {
		_, hi := g.pre.StageLayers(st)
		t, err := end(lastReq, lastChunk, hi-1)
		if err != nil {
			return err
		}
		if t.After(fwdEnd) {
			fwdEnd = t
		}
	}
	s0, ok := col.get(kernelName(lastReq, 0, 0))
	if !ok {
		return errors.AssertionFailedf("no span for the request's first kernel")
	}
	mr.forward, mr.fwdEnd = fwdEnd.Sub(s0.Start), fwdEnd
	mr.exposed = max(0, lastRet.Sub(fwdEnd))

	kinds := g.pre.Kinds()
	var lastLand time.Time
	for _, rk := range ranks {
		lo, hi := g.pre.StageLayers(rk.st)
		hooks := min(hi, g.hooks) - lo
		owner := cp.CP{Size: cfg.CP, Rank: rk.c, Rule: cfg.CPRule}
		var batches []linkBatch
		// add queues, per destination, the batch of model layers [a, b).
		add := func(req int, ready time.Time, pages, a, b int) {
			for _, rt := range rk.routes {
				layers := min(b, rt.LayerHi) - max(a, rt.LayerLo)
				if n := float64(pages) * float64(max(layers, 0)*kinds) * float64(rt.PageBytes()); n > 0 {
					batches = append(batches, linkBatch{req: req, ready: ready, bytes: n, order: len(batches)})
				}
			}
		}
		for req := 0; req <= lastReq; req++ {
			for k, ch := range r.chunks {
				owned, _, err := owner.Owned(r.src[ch.rng.PageStart:ch.rng.PageStart+ch.rng.Pages], ch.rng.PageStart, g.promptPages)
				if err != nil {
					return err
				}
				stageEnd, err := end(req, k, hi-1)
				if err != nil {
					return err
				}
				if !perLayer {
					add(req, stageEnd, len(owned), lo, hi)
					continue
				}
				for a := 0; a < hooks; a += cfg.GroupSize {
					b := min(a+cfg.GroupSize, hooks)
					ready, err := end(req, k, lo+b-1)
					if err != nil {
						return err
					}
					add(req, ready, len(owned), lo+a, lo+b)
				}
				add(req, stageEnd, len(owned), lo+hooks, hi)
			}
		}
		land := idealLandings(batches, cfg.LinkGbps*1e9/8, cfg.LinkLatency)
		for i, b := range batches {
			if b.req == lastReq && land[i].After(lastLand) {
				lastLand = land[i]
			}
		}
	}
	mr.floor = max(0, lastLand.Sub(fwdEnd))
	return nil
}

// Phases split the exposed time as the engine does (system.Phases), from
// the end of the request's last forward, at the last event wait that
// returned, the last post and the last landing of the chunk whose Finish
// returned last, then that return; each instant is clamped to the one
// before, so the phases add up to the exposed time.
type Phases struct {
	DetectMs float64 `json:"detect_ms"`
	PostMs   float64 `json:"post_ms"`
	LandMs   float64 `json:"land_ms"`
	FinishMs float64 `json:"finish_ms"`
}

func phases(fwdEnd time.Time, s system.ChunkStats, ret time.Time) Phases {
	later := func(a, b time.Time) time.Time {
		if b.After(a) {
			return b
		}
		return a
	}
	t1 := later(fwdEnd, s.LastWait)
	t2 := later(t1, s.LastPost)
	t3 := later(t2, s.LastDone)
	t4 := later(t3, ret)
	return Phases{DetectMs: ms(t1.Sub(fwdEnd)), PostMs: ms(t2.Sub(t1)), LandMs: ms(t3.Sub(t2)), FinishMs: ms(t4.Sub(t3))}
}
