package scalebench

import (
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
	return cfg
}

// measureExposure runs the sim at p runs times and returns the median of
// the per-layer run's exposed ÷ floor (means over requests). A run whose
// oracles failed is an error.
func measureExposure(ctx context.Context, p Point, runs int) (float64, error) {
	var ratios []float64
	for range runs {
		rep, err := workload.Run(ctx, simConfig(p), zap.NewNop())
		if err != nil {
			return 0, err
		}
		switch {
		case !rep.BytesEqual:
			return 0, errors.Newf("sim at %+v: bytes differ: %s", p, rep.Mismatch)
		case len(rep.OracleFailures) > 0:
			return 0, errors.Newf("sim at %+v: oracles failed: %v", p, rep.OracleFailures)
		case rep.PerLayer == nil || rep.PerLayer.FloorMs <= 0:
			return 0, errors.Newf("sim at %+v: no per-layer floor", p)
		}
		ratios = append(ratios, rep.PerLayer.RatioToFloor)
	}
	slices.Sort(ratios)
	return ratios[len(ratios)/2], nil
}
