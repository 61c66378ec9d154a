package workload

import (
	"sort"
	"time"

	"github.com/kvstream/kvstream/cp/reshard"
)

// The ideal floor (docs/PERFORMANCE.md, "The floor"): for each request, the
// instant an ideal sender with no overhead at all would have landed the
// request's last byte, minus the modeled end of the request's last forward.
// The ideal sender sees every batch the moment its gating kernel ends (the
// last layer of its group; the forward's last kernel for the hookless
// buffers and for a monolithic send) and puts it on the link at once; the
// link serves batches in that order, one after the other, each taking its
// bytes over the link rate, and a batch lands the link latency after its
// last byte left. Whatever is ahead on the link (an earlier group, another
// request's batch of the same forward) delays it; batches ready at the same
// instant go in the order the engine creates them (groups in order, the
// forward's chunks in registration order). No engine can beat this: a
// measured exposed time below it is a bug in the measurement. One caveat:
// when several requests' last chunks share one forward (prompts shorter than
// the chunk budget), the submitters may post their equal-ready batches in
// another order, and the request served first can come in under its floor
// at the others' expense, so that the mean over them can fall under the
// mean floor. The workloads of docs/PERFORMANCE.md have at most one
// request's last chunk per forward; kvstream bench scale puts every room in
// one forward and compares the forward's last landing with the floor's
// last, which no order can beat (lab/scalebench, forwardRatio).

// linkBatch is one batch the ideal sender puts on the link.
type linkBatch struct {
	room  int
	ready time.Duration // its gating kernel's end on the modeled timeline
	bytes float64       // modeled (real) bytes
	order int           // generation order: ties in ready go in this order
}

// idealLandings returns, per batch (in the order given), the instant it
// lands on a link of bw bytes/s and the given latency.
func idealLandings(batches []linkBatch, bw float64, latency time.Duration) []time.Duration {
	idx := make([]int, len(batches))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := batches[idx[a]], batches[idx[b]]
		if x.ready != y.ready {
			return x.ready < y.ready
		}
		return x.order < y.order
	})
	out := make([]time.Duration, len(batches))
	var free time.Duration // when the link's last byte left
	for _, i := range idx {
		b := batches[i]
		start := max(free, b.ready)
		free = start + time.Duration(b.bytes/bw*float64(time.Second))
		out[i] = free + latency
	}
	return out
}

// kernelEnds gives the modeled end of forward k's (0-based) layer l.
type kernelEnds func(k, l int) time.Duration

// floors returns each request's floor (ms) for one mode, on the timeline
// ends describes.
func floors(cfg Config, g geometry, p *plan, perLayer bool, ends kernelEnds) []float64 {
	batches, lastForward := floorBatches(cfg, g, p, perLayer, ends)
	land := idealLandings(batches, cfg.LinkGbps*1e9/8, cfg.LinkLatency)
	last := make([]time.Duration, cfg.Requests)
	for i, b := range batches {
		last[b.room] = max(last[b.room], land[i])
	}
	out := make([]float64, cfg.Requests)
	for r := range out {
		end := ends(lastForward[r], g.layers-1)
		out[r] = msf(max(last[r]-end, 0))
	}
	return out
}

// lowerBounds returns, per request, the exposed time (ms) below which no
// sender can land it: the request's own batches alone on the link, each
// sent when its gating kernel ends. Unlike the floor, no other request's
// batch is ahead of them, so a sender that serves one request first (and
// its batch order among requests that share a forward differs from the
// floor's) cannot beat it either; a measured exposed time below it means
// bytes counted as landed before they could have (the run fails).
func lowerBounds(cfg Config, g geometry, p *plan, perLayer bool, ends kernelEnds) []float64 {
	batches, lastForward := floorBatches(cfg, g, p, perLayer, ends)
	byRoom := make([][]linkBatch, cfg.Requests)
	for _, b := range batches {
		byRoom[b.room] = append(byRoom[b.room], b)
	}
	out := make([]float64, cfg.Requests)
	for r, own := range byRoom {
		var last time.Duration
		for _, at := range idealLandings(own, cfg.LinkGbps*1e9/8, cfg.LinkLatency) {
			last = max(last, at)
		}
		out[r] = msf(max(last-ends(lastForward[r], g.layers-1), 0))
	}
	return out
}

// floorBatches are the batches the ideal sender puts on the link, and each
// request's last forward.
func floorBatches(cfg Config, g geometry, p *plan, perLayer bool, ends kernelEnds) ([]linkBatch, []int) {
	groups := (g.hookLayers + cfg.GroupSize - 1) / cfg.GroupSize
	perLayerBufs := 1
	if !cfg.Preset.MLA {
		perLayerBufs = 2
	}
	hookless := cfg.Preset.ExtraLayers * perLayerBufs
	var batches []linkBatch
	lastForward := make([]int, cfg.Requests)
	add := func(room int, ready time.Duration, bytes float64) {
		if bytes > 0 {
			batches = append(batches, linkBatch{room: room, ready: ready, bytes: bytes, order: len(batches)})
		}
	}
	for k, fw := range p.forwards {
		end := ends(k, g.layers-1)
		for _, pc := range fw {
			lastForward[pc.room] = k
		}
		if !perLayer {
			for _, pc := range fw {
				add(pc.room, end, float64(pc.owned)*float64(g.pageBytes)*float64(g.buffers))
			}
			continue
		}
		for gi := 0; gi < groups; gi++ {
			lo, hi := gi*cfg.GroupSize, min((gi+1)*cfg.GroupSize, g.hookLayers)
			for _, pc := range fw {
				add(pc.room, ends(k, hi-1), float64(pc.owned)*float64(g.pageBytes)*float64((hi-lo)*perLayerBufs))
			}
		}
		for _, pc := range fw {
			add(pc.room, end, float64(pc.owned)*float64(g.pageBytes)*float64(hookless))
		}
	}
	return batches, lastForward
}

// idealTimeline is the modeled timeline with forwards back to back from 0
// and every layer taking the compute model's time: the timeline of a host
// that launches without delay.
func idealTimeline(cfg Config, g geometry, p *plan) kernelEnds {
	start := make([]time.Duration, len(p.forwards))
	per := make([]time.Duration, len(p.forwards))
	var t time.Duration
	for k, fw := range p.forwards {
		tokens := 0
		for _, pc := range fw {
			tokens += pc.end - pc.start
		}
		per[k] = cfg.layerTime(tokens)
		start[k] = t
		t += per[k] * time.Duration(g.layers)
	}
	return func(k, l int) time.Duration { return start[k] + per[k]*time.Duration(l+1) }
}

// layerTime is the modeled duration of one layer's kernel in a forward of
// the given tokens.
func (c Config) layerTime(tokens int) time.Duration {
	us := c.Preset.LayerUsPerKTok
	if c.LayerUsPerKTok > 0 {
		us = c.LayerUsPerKTok
	}
	return time.Duration(float64(tokens) / 1000 * us * float64(time.Microsecond))
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
