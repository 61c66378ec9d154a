package scalebench

import (
	"cmp"
	"context"
	"slices"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/lab/workload"
	"go.uber.org/zap"
)

// SimForwardTokens is the sim's one forward at every point: its tokens are
// split evenly over the point's rooms (one request each), so that the rooms
// axis asks how the engine's cost grows when the same work comes as more
// rooms. SimPageSize lets 1024 rooms of 16 tokens each hold a page.
const (
	SimForwardTokens = 16384
	SimPageSize      = 16
	// SimScale divides the bytes per page the sim keeps in memory.
	SimScale = 64
)

// simConfig is the sim run of a point: the default preset (dsv3) with the
// point's hook layers, one forward of SimForwardTokens split over the
// point's rooms, and the point's destinations as decode TP ranks (each
// receives the whole MLA latent from the one prefill rank).
func simConfig(p Point) workload.Config {
	cfg := workload.Defaults()
	cfg.Layers = p.Layers
	cfg.Requests = p.Rooms
	cfg.PageSize = SimPageSize
	cfg.PromptTokens = SimForwardTokens / p.Rooms
	cfg.ChunkTokens = cfg.PromptTokens * p.Rooms
	if p.Dests > 1 {
		cfg.DecodeTP = p.Dests
	}
	// The sim checks every request's pages on its transfer worker the
	// moment its Finish returns; with many rooms in one forward those
	// compares (at the default scale, tens of megabytes a room) take the
	// CPU from the other rooms' Finish and were most of their exposed time
	// (16 rooms: 535x the floor at scale 2, 14x at scale 64). Scale divides
	// only the bytes in memory: pages, writes and the modeled link stay real.
	cfg.Scale = SimScale
	// Even at scale 64 the check of each room's pages at its Finish (about
	// 0.4 ms a room here) ran on the transfer workers inside the timed
	// window and delayed the other rooms' Finish: 16 rooms, 14.8x the floor
	// with it, 1.75x without. The transport oracle and the checks at
	// release and at the end of the run stay.
	cfg.NoCheckAtFinish = true
	return cfg
}

// exposure is one point's sim figures: the forward's exposure over its
// floor, and how late the emulated link landed (lagMs, its p99), of the run
// with the median ratio.
type exposure struct {
	ratio, lagMs float64
}

// measureExposure runs the sim at p runs times and returns the run with
// the median per-layer forward exposure over its floor (forwardRatio). A
// run whose oracles failed is an error.
func measureExposure(ctx context.Context, p Point, runs int) (exposure, error) {
	var got []exposure
	for range runs {
		rep, err := workload.Run(ctx, simConfig(p), zap.NewNop())
		if err != nil {
			return exposure{}, err
		}
		switch {
		case !rep.BytesEqual:
			return exposure{}, errors.Newf("sim at %+v: bytes differ: %s", p, rep.Mismatch)
		case len(rep.OracleFailures) > 0:
			return exposure{}, errors.Newf("sim at %+v: oracles failed: %v", p, rep.OracleFailures)
		case rep.PerLayer == nil || rep.PerLayer.FloorMs <= 0:
			return exposure{}, errors.Newf("sim at %+v: no per-layer floor", p)
		}
		ratio, err := forwardRatio(rep.PerLayer)
		if err != nil {
			return exposure{}, errors.Wrapf(err, "sim at %+v", p)
		}
		_, lag := rep.PerLayer.LinkLag.Tail()
		got = append(got, exposure{ratio: ratio, lagMs: lag})
	}
	slices.SortFunc(got, func(a, b exposure) int { return cmp.Compare(a.ratio, b.ratio) })
	return got[len(got)/2], nil
}

// forwardRatio is the exposure of the sweep's one forward over its floor:
// the last room's exposed time (its Finish returned) over the last room's
// floor (the ideal sender's last landing). All the rooms share the forward
// and its link, so the ideal sender's last landing is a bound on the
// forward's whatever the order the rooms are served in: the ratio cannot be
// below 1. The sim's own ratio (mean exposed over mean floor) can: the
// floor puts the rooms' batches of a group in registration order, and an
// engine that serves rooms one after the other lands most of them before
// their place in that order (decode TP 32, where the link is busy
// throughout: 0.79-0.94).
func forwardRatio(m *workload.ModeReport) (float64, error) {
	var floor float64
	for _, r := range m.PerRequest {
		floor = max(floor, r.FloorMs)
	}
	if floor <= 0 || m.Exposed.N == 0 {
		return 0, errors.Newf("no floor (%v ms) or no exposed time (%d requests)", floor, m.Exposed.N)
	}
	return m.Exposed.Max / floor, nil
}
