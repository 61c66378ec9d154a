package workload

import (
	"context"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// DataPlane is a decode side in another process (RunRemote): it gives the
// prefill side's transport and receives, and checks, the KV.
type DataPlane interface {
	// Open readies a decode pool of geom (the model's bytes are seeded by
	// seed) and returns the prefill transport and the decode peer. It
	// returns when ctx (the run's) ends: connecting to another process
	// may wait for it.
	Open(ctx context.Context, geom testbed.Geometry, seed uint64, log *zap.Logger) (rdma.Transport, system.Peer, error)
	// OnPeerLost sets what to do when the decode side is lost: the run
	// fails the work to it at once instead of at the finish timeout.
	OnPeerLost(func(error))
	// ChunkDone tells the decode side a chunk ended; it verifies the
	// chunk's pages on the spot. It is called off the transfer workers, in
	// chunk order per request, and a request's slot is released only once
	// its last chunk's call returned.
	ChunkDone(Notice)
	// Verify returns the first page the decode side found wrong, or "";
	// the decode side checks against its own pattern.
	Verify() string
	// Close releases the decode side.
	Close() error
}

// Notice is a finished chunk, for the decode side.
type Notice struct {
	Room       uint64
	Start, End int
	Status     system.Status
	Err        error
	Bytes      uint64
	// Positions are the request positions this rank sent, DstPages their
	// decode pages.
	Positions, DstPages []int
}

// notice is how chunk pc ended on every prefill rank (res: together).
func notice(p *plan, pc piece, res system.Result) Notice {
	n := Notice{Room: uint64(pc.room), Start: pc.start, End: pc.end, Status: res.Status, Err: res.Err, Bytes: res.Stats.Bytes}
	for _, x := range pc.positions {
		n.Positions = append(n.Positions, x)
		n.DstPages = append(n.DstPages, p.dst(pc.room)[x])
	}
	return n
}

// decodeSide is the decode side of a run as the rig (runRig) drives it:
// the sim's own pools and modeled links (localPlane unsharded,
// shardedDecode sharded) or another process's decode side (remotePlane).
// Prefill ranks are numbered stage-major, as the rig builds them.
type decodeSide interface {
	// open readies the decode side and returns the peers every prefill
	// engine adds (one per decode rank); a remote side's connect ends
	// with ctx.
	open(ctx context.Context, log *zap.Logger) ([]system.Peer, error)
	// transport is prefill rank ri's transport, as its engine sees it; a
	// local side injects faults below its transport oracle, which then
	// judges what the transport really carried (a remote side injects
	// none).
	transport(ri int, faults *injector) (rdma.Transport, error)
	// prefill gives the side the prefill pools (by rank) before any chunk
	// is registered: a check may compare against them.
	prefill(pools []*testbed.Pool)
	// expect is told of chunk pc before prefill rank ri registers it, so
	// before any of its batches can be posted.
	expect(ri int, pc piece)
	// landed is told that prefill rank ri's Finish of pc returned SUCCESS.
	landed(ri int, pc piece)
	// ChunkDone is told how a chunk ended once every prefill rank's Finish
	// of it returned. A side in this process checks the chunk on the
	// transfer worker, right after the Finish; a remote one is told off it
	// (notifier).
	ChunkDone(Notice)
	// Release checks a finished request's decode pages and clears them
	// before another request takes its slot (see residency).
	Release(room int)
	// OnPeerLost sets what to do when the decode side is lost.
	OnPeerLost(func(error))
	// remote says the decode side is another process: it is told of chunks
	// off the workers, and a Register error is its loss or refusal (the
	// run stops early: Aborted), where for the sim's own pools it is an
	// engine bug (the run's error).
	remote() bool
	// verify is the run's byte verdict once every chunk ended: the first
	// difference found, or "". Requests [from, to) still hold their slots.
	verify(from, to int) string
	// violations are what the transport oracle (lab/landguard) caught.
	violations() []string
	// close releases the decode side, after the engines and the GPU.
	close()
}

// remotePlane is a decode side in another process, over its DataPlane (a
// ShardedPlane for a sharded run): every prefill rank sends over the one
// transport it gives. It checks each chunk as its notice arrives, so
// Release has nothing to do, and there is no transport oracle.
type remotePlane struct {
	dp  DataPlane
	cfg Config
	g   geometry
	p   *plan
	tr  rdma.Transport
}

func (r *remotePlane) open(ctx context.Context, log *zap.Logger) ([]system.Peer, error) {
	if r.g.sharded {
		sp, ok := r.dp.(ShardedPlane)
		if !ok {
			return nil, errors.AssertionFailedf("a sharded run with a decode side (%T) that does not shard", r.dp)
		}
		tr, peers, err := openRemote(ctx, sp, r.cfg, r.g, r.p, log)
		r.tr = tr
		return peers, err
	}
	tr, peer, err := r.dp.Open(ctx, prefillGeometry(r.cfg, r.g, 0, r.p.pool), r.cfg.Seed, log)
	r.tr = tr
	return []system.Peer{peer}, err
}

func (r *remotePlane) transport(int, *injector) (rdma.Transport, error) { return r.tr, nil }
func (r *remotePlane) prefill([]*testbed.Pool)                          {}
func (r *remotePlane) expect(int, piece)                                {}
func (r *remotePlane) landed(int, piece)                                {}
func (r *remotePlane) ChunkDone(n Notice)                               { r.dp.ChunkDone(n) }
func (r *remotePlane) Release(int)                                      {}
func (r *remotePlane) OnPeerLost(f func(error))                         { r.dp.OnPeerLost(f) }
func (r *remotePlane) remote() bool                                     { return true }
func (r *remotePlane) verify(int, int) string                           { return r.dp.Verify() }
func (r *remotePlane) violations() []string                             { return nil }
func (r *remotePlane) close()                                           { _ = r.dp.Close() }

// RemoteLayout is what an unsharded RunRemote of c writes into its decode
// side: the prefill pool's geometry, as DataPlane.Open describes it (the
// pool a decode process sizes from that Hello), and each request's decode
// pages by position (request r's position x lands on page Pages[r][x]).
// Requests beyond the resident ones take a finished one's pages. A
// sharded c has no single pool: an error.
func (c Config) RemoteLayout() (geom testbed.Geometry, pages [][]int, err error) {
	g, err := c.validate()
	if err != nil {
		return geom, nil, err
	}
	if g.sharded {
		return geom, nil, errors.Newf("%s: a sharded run has one pool per decode rank", c.tpFlags())
	}
	p, err := newPlan(c, g)
	if err != nil {
		return geom, nil, err
	}
	for r := range c.Requests {
		pages = append(pages, append([]int(nil), p.dst(r)...))
	}
	return prefillGeometry(c, g, 0, p.pool), pages, nil
}
