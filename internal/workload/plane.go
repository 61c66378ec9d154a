package workload

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/internal/testbed"
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
	// Verify returns the first page that differs from the prefill pool, or
	// "": of the requests still resident at the end of the run, or of any
	// request a release checked.
	Verify(pool *testbed.Pool) string
	// Close releases the decode side.
	Close() error
}

// releaser is a DataPlane in this process: it checks a finished request's
// decode pages and clears them before another request takes its slot (see
// residency), and its ChunkDone checks a chunk's pages on the spot, so it
// runs on the transfer worker, right after Finish. A remote decode side
// checks each chunk as its notice arrives, needs no release, and is told
// off the worker (notifier).
type releaser interface {
	// Prefill gives the decode side the prefill pool, before any chunk:
	// ChunkDone compares against its pages.
	Prefill(pool *testbed.Pool)
	Release(room int, pool *testbed.Pool)
	// expect is told of a chunk before it is registered with the engine,
	// violations returns what the transport oracle (landGuard) caught.
	expect(pc piece)
	violations() []string
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

func notice(cfg Config, g geometry, p *plan, pc piece, res system.Result) Notice {
	n := Notice{Room: uint64(pc.room), Start: pc.start, End: pc.end, Status: res.Status, Err: res.Err, Bytes: res.Stats.Bytes}
	for _, x := range pc.positions {
		n.Positions = append(n.Positions, x)
		n.DstPages = append(n.DstPages, p.dst(pc.room)[x])
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
	guard  *landGuard // the prefill transport as the engine sees it

	prefill *testbed.Pool // set by Prefill before the first chunk

	mu       sync.Mutex
	atDone   string // the first mismatch seen when a Finish returned SUCCESS
	released string // the first mismatch seen when a request's slot was released
}

func (l *localPlane) Open(geom testbed.Geometry, _ uint64, _ *zap.Logger) (rdma.Transport, system.Peer, error) {
	fab := loopback.NewFabric(loopback.Options{
		Bandwidth: l.cfg.LinkGbps * 1e9 / 8, Latency: l.cfg.LinkLatency, TimeScale: l.cfg.TimeScale, ByteScale: l.g.byteScale, Precise: true,
		Slow: l.cfg.plantSlow,
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
	per := l.decode.ItemLen * uint64(l.decode.Pages)
	l.guard = newLandGuard(l.pre, func(addr uint64) (string, int, int, bool) {
		for b, base := range l.decode.Bases {
			if addr >= base && addr < base+per {
				pg := int((addr - base) / l.decode.ItemLen)
				return l.decode.Names[b], pg, pg, true
			}
		}
		return "", 0, 0, false
	})
	var tr rdma.Transport = l.guard
	if l.cfg.plantTransport != nil {
		tr = l.cfg.plantTransport(tr)
	}
	return tr, l.decode.Peer("decode"), nil
}

// expect implements releaser.
func (l *localPlane) expect(pc piece) {
	dst := make([]int, len(pc.positions))
	for i, x := range pc.positions {
		dst[i] = l.p.dst(pc.room)[x]
	}
	l.guard.expect(pc.room, pc.start, pc.end, pc.positions, dst)
}

// violations implements releaser.
func (l *localPlane) violations() []string {
	if l.guard == nil {
		return nil
	}
	return l.guard.violations()
}

// Prefill implements releaser.
func (l *localPlane) Prefill(pool *testbed.Pool) { l.prefill = pool }

// ChunkDone checks a chunk's destination pages the moment its Finish
// returned SUCCESS: by then every byte of the chunk must be in place (a
// write landing after Finish, or a read of the source before its kernel
// ended, shows here even when the end-of-run check would pass). It runs on
// the transfer worker, right before the next chunk's landing, so it is a
// memcmp against the prefill page (final by now: the chunk's forward
// ended) plus the pattern's first bytes, which an early read that caught
// the prefill page stale or poisoned cannot match; generating the whole
// pattern here cost more than the transfers it checks. Release and the end
// of the run compare every byte with the pattern.
func (l *localPlane) ChunkDone(n Notice) {
	if n.Status != system.Succeeded || l.decode == nil || l.prefill == nil {
		return
	}
	l.guard.finished(int(n.Room), n.Start)
	src := l.p.src(int(n.Room))
	var head [16]byte
	want := head[:min(len(head), l.g.itemLen)]
	for i, pos := range n.Positions {
		for b := 0; b < l.decode.Geometry.Buffers(); b++ {
			testbed.Fill(want, l.cfg.Seed, n.Room, b, pos)
			got := l.decode.Page(b, n.DstPages[i])
			pre := l.prefill.Page(b, src[pos])
			if bytes.Equal(got, pre) && bytes.Equal(got[:len(want)], want) {
				continue
			}
			full := make([]byte, l.g.itemLen)
			testbed.Fill(full, l.cfg.Seed, n.Room, b, pos)
			l.mu.Lock()
			if l.atDone == "" {
				l.atDone = fmt.Sprintf("room %d chunk %d-%d position %d (decode page %d) buffer %s: at Finish SUCCESS, %s",
					n.Room, n.Start, n.End, pos, n.DstPages[i], l.decode.Names[b], describe(got, full))
			}
			l.mu.Unlock()
			return
		}
	}
}

// describe says what a wrong page holds: the poison of a kernel that had
// not ended, stale bytes from before it started, zeros (never written) or
// something else.
func describe(got, want []byte) string {
	all := func(v byte) bool {
		for _, x := range got {
			if x != v {
				return false
			}
		}
		return true
	}
	switch {
	case testbed.Poisoned(got):
		return "bytes differ from the source: poison (read while the layer's kernel ran)"
	case all(staleByte):
		return "bytes differ from the source: stale prefill bytes (read before the layer's kernel started)"
	case all(0):
		return "bytes differ from the source: zeros (never written)"
	}
	return "bytes differ from the source"
}

// Verify returns the first mismatch seen at a Finish or a release, else
// compares every page of the requests still resident (see check).
func (l *localPlane) Verify(pool *testbed.Pool) string {
	l.mu.Lock()
	atDone, released := l.atDone, l.released
	l.mu.Unlock()
	if atDone != "" {
		return atDone
	}
	if released != "" {
		return released
	}
	for r := max(0, l.cfg.Requests-l.p.resident); r < l.cfg.Requests; r++ {
		if msg := l.check(pool, r, "at the end of the run"); msg != "" {
			return msg
		}
	}
	return ""
}

// Release checks a finished request's pages, then zeroes its decode pages:
// the next request of the slot starts from a pool in which a page it never
// writes shows as zeros.
func (l *localPlane) Release(room int, pool *testbed.Pool) {
	if msg := l.check(pool, room, "when its slot was released"); msg != "" {
		l.mu.Lock()
		if l.released == "" {
			l.released = msg
		}
		l.mu.Unlock()
	}
	for _, pg := range l.p.dst(room) {
		for b := 0; b < l.decode.Buffers(); b++ {
			clear(l.decode.Page(b, pg))
		}
	}
}

// check compares every decode page of request r: the owned positions with
// the pattern the model wrote (and the source pages with it), every other
// page must be zero.
func (l *localPlane) check(pool *testbed.Pool, r int, when string) string {
	cfg, g, p := l.cfg, l.g, l.p
	zero := make([]byte, g.itemLen)
	pattern := make([]byte, g.itemLen)
	owned := map[int]bool{}
	_, pos, _ := cfg.CP.Owned(p.src(r), 0, g.pagesPerRequest)
	for _, x := range pos {
		owned[x] = true
	}
	src, dst := p.src(r), p.dst(r)
	for x := 0; x < g.pagesPerRequest; x++ {
		for b := 0; b < pool.Geometry.Buffers(); b++ {
			got := l.decode.Page(b, dst[x])
			want := zero
			if owned[x] {
				testbed.Fill(pattern, cfg.Seed, uint64(r), b, x)
				want = pattern
				if pre := pool.Page(b, src[x]); !bytes.Equal(pre, want) {
					return fmt.Sprintf("room %d position %d (prefill page %d) buffer %s: %s, the prefill page is not what the model wrote (a harness bug)", r, x, src[x], pool.Names[b], when)
				}
			}
			if !bytes.Equal(got, want) {
				return fmt.Sprintf("room %d position %d (decode page %d) buffer %s: %s, %s", r, x, dst[x], pool.Names[b], when, describe(got, want))
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
