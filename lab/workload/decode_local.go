package workload

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/landguard"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// The sim's own decode sides: decode pools in this process, reached over a
// loopback fabric whose links model the configured rate, each prefill
// rank's transport wrapped in the transport oracle (lab/landguard). They are
// oracles: every byte a run lands is checked, at Finish and when its
// request is released or the run ends, and a difference names room,
// position, decode page and buffer.

// localSide is the sim's decode side for the configuration.
func localSide(cfg Config, g geometry, p *plan) decodeSide {
	if g.sharded {
		return &shardedDecode{cfg: cfg, g: g, p: p, snaps: map[int][]snapshot{}}
	}
	return &localPlane{cfg: cfg, g: g, p: p}
}

// newFabric is the modeled network of a local run: a link per sending
// transport; lags records how late each batch landed.
func newFabric(cfg Config, g geometry, lags *linkLags) *loopback.Fabric {
	return loopback.NewFabric(loopback.Options{
		Bandwidth: cfg.LinkGbps * 1e9 / 8, Latency: cfg.LinkLatency, TimeScale: cfg.TimeScale, ByteScale: g.byteScale, Precise: true,
		Slow: cfg.plantSlow, OnBatch: lags.add,
	})
}

// linkLags records how late the emulated link landed each batch after its
// modeled instant: the emulator's own lag (its goroutine waiting for a
// processor, or a copy that could not finish in time), which every landing
// and so the exposed time carries, and which no real link has.
type linkLags struct {
	mu   sync.Mutex
	lags []time.Duration // wall time
}

func (l *linkLags) add(s loopback.BatchSpan) {
	lag := max(s.Landed.Sub(s.Due), 0)
	l.mu.Lock()
	l.lags = append(l.lags, lag)
	l.mu.Unlock()
}

// linkLag implements linkLagger.
func (l *linkLags) linkLag() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.lags...)
}

// linkLagger is a decode side on the emulated link: it says how late its
// batches landed (wall time).
type linkLagger interface{ linkLag() []time.Duration }

// localPlane is the decode side of an unsharded sim run: one decode pool,
// whole pages, the model's pattern testbed.Fill.
type localPlane struct {
	cfg      Config
	g        geometry
	p        *plan
	fab      *loopback.Fabric
	linkLags // how late the link landed its batches
	pre      *loopback.Transport
	dec      *loopback.Transport
	decode   *testbed.Decode
	guard    *landguard.Oracle // the transport oracle
	wrapped  *landguard.Guard  // the prefill transport as the engine sees it

	prefillPool *testbed.Pool // set by prefill before the first chunk

	atDone   firstMsg // the first mismatch seen when a Finish returned SUCCESS
	released firstMsg // the first mismatch seen when a request's slot was released
}

// firstMsg keeps the first difference a check reported.
type firstMsg struct {
	mu  sync.Mutex
	msg string
}

func (f *firstMsg) keep(msg string) {
	f.mu.Lock()
	if f.msg == "" {
		f.msg = msg
	}
	f.mu.Unlock()
}

func (f *firstMsg) get() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.msg
}

// clearPages zeroes pages of every buffer of each pool: a request that
// takes a released slot starts from pages in which one it never writes
// shows as zeros.
func clearPages(pools []*testbed.Decode, pages []int) {
	for _, pool := range pools {
		for _, pg := range pages {
			for b := 0; b < pool.Buffers(); b++ {
				clear(pool.Page(b, pg))
			}
		}
	}
}

func (l *localPlane) open(context.Context, *zap.Logger) (_ []system.Peer, err error) {
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	l.fab = newFabric(l.cfg, l.g, &l.linkLags)
	if l.dec, err = l.fab.NewTransport("decode"); err != nil {
		return nil, err
	}
	if l.decode, err = testbed.NewDecode(l.dec, prefillGeometry(l.cfg, l.g, 0, l.p.pool)); err != nil {
		return nil, err
	}
	return []system.Peer{l.decode.Peer("decode")}, nil
}

func (l *localPlane) transport(_ int, faults *injector) (rdma.Transport, error) {
	var err error
	if l.pre, err = l.fab.NewTransport("prefill"); err != nil {
		return nil, err
	}
	l.guard = landguard.New(landguard.NewPools([]*testbed.Decode{l.decode}, nil))
	l.wrapped = l.guard.Wrap(faults.wrap(l.pre))
	return l.wrapped, nil
}

func (l *localPlane) prefill(pools []*testbed.Pool) { l.prefillPool = pools[0] }
func (l *localPlane) OnPeerLost(func(error))        {} // the sim's own pool is not lost
func (l *localPlane) remote() bool                  { return false }

func (l *localPlane) expect(_ int, pc piece) {
	dst := make([]int, len(pc.positions))
	for i, x := range pc.positions {
		dst[i] = l.p.dst(pc.room)[x]
	}
	l.wrapped.Expect(pc.room, pc.start, pc.end, pc.positions, dst)
}

func (l *localPlane) landed(_ int, pc piece) { l.wrapped.Finished(pc.room, pc.start) }

func (l *localPlane) violations() []string {
	if l.guard == nil {
		return nil
	}
	return l.guard.Violations()
}

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
	if n.Status != system.Succeeded || l.cfg.NoCheckAtFinish {
		return
	}
	src := l.p.src(int(n.Room))
	var head [16]byte
	want := head[:min(len(head), l.g.itemLen)]
	for i, pos := range n.Positions {
		for b := 0; b < l.decode.Geometry.Buffers(); b++ {
			testbed.Fill(want, l.cfg.Seed, n.Room, b, pos)
			got := l.decode.Page(b, n.DstPages[i])
			pre := l.prefillPool.Page(b, src[pos])
			if bytes.Equal(got, pre) && bytes.Equal(got[:len(want)], want) {
				continue
			}
			full := make([]byte, l.g.itemLen)
			testbed.Fill(full, l.cfg.Seed, n.Room, b, pos)
			l.atDone.keep(fmt.Sprintf("room %d chunk %d-%d position %d (decode page %d) buffer %s: at Finish SUCCESS, %s",
				n.Room, n.Start, n.End, pos, n.DstPages[i], l.decode.Names[b], describe(got, full)))
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

// verify returns the first mismatch seen at a Finish or a release, else
// compares every page of the requests still resident (see check).
func (l *localPlane) verify(from, to int) string {
	if msg := l.atDone.get(); msg != "" {
		return msg
	}
	if msg := l.released.get(); msg != "" {
		return msg
	}
	for r := from; r < to; r++ {
		if msg := l.check(r, "at the end of the run"); msg != "" {
			return msg
		}
	}
	return ""
}

// Release checks a finished request's pages, then zeroes its decode pages:
// the next request of the slot starts from a pool in which a page it never
// writes shows as zeros.
func (l *localPlane) Release(room int) {
	if msg := l.check(room, "when its slot was released"); msg != "" {
		l.released.keep(msg)
	}
	clearPages([]*testbed.Decode{l.decode}, l.p.dst(room))
}

// check compares every decode page of request r: the owned positions with
// the pattern the model wrote (and the source pages with it), every other
// page must be zero.
func (l *localPlane) check(r int, when string) string {
	cfg, g, p, pool := l.cfg, l.g, l.p, l.prefillPool
	zero := make([]byte, g.itemLen)
	pattern := make([]byte, g.itemLen)
	owned := p.owned(r)
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

func (l *localPlane) close() {
	if l.pre != nil {
		_ = l.pre.Close()
	}
	if l.dec != nil {
		_ = l.dec.Close()
	}
	if l.decode != nil {
		_ = l.decode.Free()
	}
}

// shardedDecode is the decode side of a sharded sim run: one decode pool
// per decode (PP stage, TP rank), each a peer with its sharding, the
// pattern pageFill; each prefill rank has its own link and oracle.
type shardedDecode struct {
	cfg      Config
	g        geometry
	p        *plan
	fab      *loopback.Fabric
	linkLags // how late the link landed its batches
	pools    []*testbed.Decode
	shadows  []*testbed.Pool    // per decode pool: the chunks' snapshots (see snapshot)
	guard    *landguard.Oracle  // over every pool
	guards   []*landguard.Guard // per prefill rank
	cleanup  []func()

	mu       sync.Mutex
	snaps    map[int][]snapshot // by room, until the room is checked
	mismatch firstMsg           // the first a release found
}

// snapshot is a chunk's decode pages on every decode rank, copied the
// moment the chunk's last Finish returned SUCCESS: a write that lands after
// Finish, or a read of a source before its kernel ended, shows in it even
// when the end of the run would pass. Checking it against the pattern costs
// a hash per (token, head) on every decode rank, so that happens after the
// run, out of the timed window; the copy is a memcpy per page, into the
// page's place in a shadow of its decode pool (a page belongs to one room
// at a time, and a chunk's positions to that chunk). The shadows are
// allocated and touched before the run: copies into fresh Go heap put a
// page fault per 4 KiB and the collector's work next to the landings, and
// a large sharded run's heap grows by hundreds of MB.
type snapshot struct {
	room      int
	positions []int
}

func (d *shardedDecode) snapshot(room int, positions []int) snapshot {
	dst := d.p.dst(room)
	for r, pool := range d.pools {
		for _, x := range positions {
			for b := 0; b < pool.Buffers(); b++ {
				copy(d.shadows[r].Page(b, dst[x]), pool.Page(b, dst[x]))
			}
		}
	}
	return snapshot{room: room, positions: positions}
}

// check compares room's positions on every decode rank (page gives the
// bytes of one) with the reshard of the logical tensor: owned positions
// (all when owned is nil) hold the pattern of their heads, every other
// page zeros. It returns the first difference, or "".
func (d *shardedDecode) check(room int, positions []int, owned map[int]bool, when string, page func(rank, i, b int) []byte) string {
	dec := &d.g.decSide
	want := make([]byte, dec.ItemLen())
	zero := make([]byte, dec.ItemLen())
	for rank, pool := range d.pools {
		st, tp := rank/dec.TP, rank%dec.TP
		for i, x := range positions {
			for b := 0; b < pool.Buffers(); b++ {
				w := zero
				if owned == nil || owned[x] {
					layer, kind := layerKind(dec, st, b)
					pageFill(want, dec, tp, d.cfg.Seed, uint64(room), layer, kind, x)
					w = want
				}
				if got := page(rank, i, b); !bytes.Equal(got, w) {
					return fmt.Sprintf("decode TP rank %d (PP stage %d) room %d position %d (decode page %d) buffer %s: %s, %s",
						tp, st, room, x, d.p.dst(room)[x], pool.Names[b], when, describe(got, w))
				}
			}
		}
	}
	return ""
}

// checkSnapshots checks, and drops, room's chunk snapshots.
func (d *shardedDecode) checkSnapshots(room int) string {
	d.mu.Lock()
	snaps := d.snaps[room]
	delete(d.snaps, room)
	d.mu.Unlock()
	for _, sn := range snaps {
		dst := d.p.dst(sn.room)
		page := func(rank, i, b int) []byte { return d.shadows[rank].Page(b, dst[sn.positions[i]]) }
		if msg := d.check(sn.room, sn.positions, nil, "at Finish SUCCESS", page); msg != "" {
			return msg
		}
	}
	return ""
}

// checkRoom checks a finished room: each chunk's snapshot (taken when it
// succeeded), then every decode page of the room as it is now (owned
// positions hold their heads' pattern, the rest zeros). It drops the
// room's snapshots.
func (d *shardedDecode) checkRoom(room int, when string) string {
	if msg := d.checkSnapshots(room); msg != "" {
		return msg
	}
	owned := d.p.owned(room)
	all := make([]int, d.g.pagesPerRequest)
	for x := range all {
		all[x] = x
	}
	page := func(rank, i, b int) []byte { return d.pools[rank].Page(b, d.p.dst(room)[all[i]]) }
	return d.check(room, all, owned, when, page)
}

// Release checks a finished room and zeroes its decode pages on every
// rank, before another room takes its slot (see residency).
func (d *shardedDecode) Release(room int) {
	if msg := d.checkRoom(room, "when its slot was released"); msg != "" {
		d.mismatch.keep(msg)
	}
	clearPages(d.pools, d.p.dst(room))
}

// verify is the run's verdict: the first mismatch a release found, else
// the check of every room still resident, else that of any snapshot left
// (a room the run did not release: none when every earlier room was).
func (d *shardedDecode) verify(from, to int) string {
	msg := d.mismatch.get()
	for room := from; room < to && msg == ""; room++ {
		msg = d.checkRoom(room, "at the end of the run")
	}
	d.mu.Lock()
	var left []int
	for room := range d.snaps {
		left = append(left, room)
	}
	d.mu.Unlock()
	sort.Ints(left)
	for _, room := range left {
		if msg != "" {
			break
		}
		msg = d.checkSnapshots(room)
	}
	return msg
}

func (d *shardedDecode) open(context.Context, *zap.Logger) (_ []system.Peer, err error) {
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	d.fab = newFabric(d.cfg, d.g, &d.linkLags)
	var peers []system.Peer
	for i := 0; i < d.g.decSide.PP()*d.g.decSide.TP; i++ {
		st, r := i/d.g.decSide.TP, i%d.g.decSide.TP
		name := fmt.Sprintf("decode-pp%d-tp%d", st, r)
		tr, err := d.fab.NewTransport(name)
		if err != nil {
			return nil, err
		}
		d.cleanup = append(d.cleanup, func() { _ = tr.Close() })
		pool, err := testbed.NewDecode(tr, geometryOf(&d.g.decSide, st, d.p.pool))
		if err != nil {
			return nil, errors.Wrapf(err, "decode PP stage %d TP rank %d pool", st, r)
		}
		d.cleanup = append(d.cleanup, func() { _ = pool.Free() })
		d.pools = append(d.pools, pool)
		shadow, err := testbed.NewPool(pool.Geometry)
		if err != nil {
			return nil, errors.Wrapf(err, "decode PP stage %d TP rank %d: the oracle's snapshot pool", st, r)
		}
		d.cleanup = append(d.cleanup, func() { _ = shadow.Free() })
		d.shadows = append(d.shadows, shadow)
		peer := pool.Peer(name)
		peer.Sharding = &system.Sharding{Side: d.g.decSide, Rank: reshard.Rank{TP: r, Stage: st}}
		peers = append(peers, peer)
	}
	d.guard = landguard.New(landguard.NewPools(d.pools, nil))
	return peers, nil
}

// transport is prefill rank ri's own link, below its oracle, which tells a
// page by its decode rank and page number.
func (d *shardedDecode) transport(ri int, faults *injector) (rdma.Transport, error) {
	raw, err := d.fab.NewTransport(rankStream(ri/d.g.preSide.TP, ri%d.g.preSide.TP))
	if err != nil {
		return nil, err
	}
	d.cleanup = append(d.cleanup, func() { _ = raw.Close() })
	gd := d.guard.Wrap(faults.wrap(raw))
	d.guards = append(d.guards, gd)
	return gd, nil
}

func (d *shardedDecode) prefill([]*testbed.Pool) {} // the check is against the pattern
func (d *shardedDecode) OnPeerLost(func(error))  {} // the sim's own pools are not lost
func (d *shardedDecode) remote() bool            { return false }

func (d *shardedDecode) expect(ri int, pc piece) {
	keys := make([]int, 0, len(pc.positions)*len(d.pools))
	for _, x := range pc.positions {
		for r := range d.pools {
			keys = append(keys, landguard.PageKey(r, d.p.dst(pc.room)[x]))
		}
	}
	d.guards[ri].Expect(pc.room, pc.start, pc.end, pc.positions, keys)
}

func (d *shardedDecode) landed(ri int, pc piece) { d.guards[ri].Finished(pc.room, pc.start) }

// ChunkDone snapshots a chunk that succeeded on every prefill rank; the
// snapshot is checked when its request is released or the run ends.
func (d *shardedDecode) ChunkDone(n Notice) {
	if n.Status != system.Succeeded || d.cfg.NoCheckAtFinish {
		return
	}
	snap := d.snapshot(int(n.Room), n.Positions)
	d.mu.Lock()
	d.snaps[int(n.Room)] = append(d.snaps[int(n.Room)], snap)
	d.mu.Unlock()
}

func (d *shardedDecode) violations() []string {
	if d.guard == nil {
		return nil
	}
	return d.guard.Violations()
}

func (d *shardedDecode) close() {
	for i := len(d.cleanup) - 1; i >= 0; i-- {
		d.cleanup[i]()
	}
}
