package workload

import (
	"bytes"
	"fmt"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// DataPlane is where a run's bytes go: the prefill side's transport and a
// decode side that receives, and checks, the KV.
type DataPlane interface {
	// Open readies a decode pool of geom (the model's bytes are seeded by
	// seed) and returns the prefill transport and the decode peer.
	Open(geom testbed.Geometry, seed uint64, log *zap.Logger) (rdma.Transport, system.Peer, error)
	// ChunkDone tells the decode side a chunk ended; a remote decode side
	// verifies the chunk's pages on the spot.
	ChunkDone(Notice)
	// Verify returns the first page that differs from the prefill pool, or "".
	Verify(pool *testbed.Pool) string
	// Close releases the decode side.
	Close() error
}

// Notice is a finished chunk, for the decode side.
type Notice struct {
	Room       uint64
	Start, End int
	Status     messages.Status
	Err        error
	Bytes      uint64
	// Positions are the request positions this rank sent, DstPages their
	// decode pages.
	Positions, DstPages []int
}

func notice(cfg Config, g geometry, p *plan, pc piece, res system.Result) Notice {
	n := Notice{Room: uint64(pc.room), Start: pc.start, End: pc.end, Status: res.Status, Err: res.Err, Bytes: res.Stats.Bytes}
	src := p.src[pc.room][pc.rng.PageStart : pc.rng.PageStart+pc.rng.Pages]
	_, pos, _ := cfg.CP.Owned(src, pc.rng.PageStart, g.pagesPerRequest)
	for _, x := range pos {
		n.Positions = append(n.Positions, x)
		n.DstPages = append(n.DstPages, p.dst[pc.room][x])
	}
	return n
}

// localPlane is the in-process decode side of `kvstream sim`: a loopback
// fabric whose link models the configured rate, and a decode pool in the
// same process.
type localPlane struct {
	cfg    Config
	g      geometry
	p      *plan
	pre    *loopback.Transport
	dec    *loopback.Transport
	decode *testbed.Decode
}

func (l *localPlane) Open(geom testbed.Geometry, _ uint64, _ *zap.Logger) (rdma.Transport, system.Peer, error) {
	fab := loopback.NewFabric(loopback.Options{
		Bandwidth: l.cfg.LinkGbps * 1e9 / 8, Latency: l.cfg.LinkLatency, TimeScale: l.cfg.TimeScale, ByteScale: l.g.byteScale, Precise: true,
	})
	var err error
	if l.pre, err = fab.NewTransport("prefill"); err != nil {
		return nil, system.Peer{}, err
	}
	if l.dec, err = fab.NewTransport("decode"); err != nil {
		return nil, system.Peer{}, err
	}
	if l.decode, err = testbed.NewDecode(l.dec, geom); err != nil {
		return nil, system.Peer{}, err
	}
	return l.pre, l.decode.Peer("decode"), nil
}

func (l *localPlane) ChunkDone(Notice) {}

// Verify compares every page of the decode pool: the owned positions with
// their source pages, every other page must still be zero.
func (l *localPlane) Verify(pool *testbed.Pool) string {
	cfg, g, p := l.cfg, l.g, l.p
	zero := make([]byte, g.itemLen)
	for r := 0; r < cfg.Requests; r++ {
		owned := map[int]bool{}
		_, pos, _ := cfg.CP.Owned(p.src[r], 0, g.pagesPerRequest)
		for _, x := range pos {
			owned[x] = true
		}
		for x := 0; x < g.pagesPerRequest; x++ {
			for b := 0; b < pool.Geometry.Buffers(); b++ {
				got := l.decode.Page(b, p.dst[r][x])
				want := zero
				if owned[x] {
					want = pool.Page(b, p.src[r][x])
				}
				if !bytes.Equal(got, want) {
					return fmt.Sprintf("room %d position %d (decode page %d) buffer %s: bytes differ from the source", r, x, p.dst[r][x], pool.Names[b])
				}
			}
		}
	}
	return ""
}

func (l *localPlane) Close() error {
	if l.pre != nil {
		_ = l.pre.Close()
	}
	if l.dec != nil {
		_ = l.dec.Close()
	}
	if l.decode != nil {
		return l.decode.Free()
	}
	return nil
}
