package loopback

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// Endpoint writes from one node into another.
type Endpoint struct {
	from, to *Transport
	via      *access // the peer access point connected through, if any

	// landMu is held across every copy into the peer's memory; Close takes
	// it after marking the endpoint closed, which makes Close a barrier. It
	// is separate from mu so that reporting a completion never waits for
	// another batch's copy. Order: landMu, then the peer's inbound, then mu.
	landMu  sync.Mutex
	mu      sync.Mutex // guards the fields below and the batches' report state
	pending map[*batch]struct{}
	closed  bool
	why     string // ": reason" when something other than the endpoint's owner closed it
	revoked bool   // closed by the peer's revocation: its errors say rdma.ErrRevoked

	// Read by every Post without a lock: a lock the link goroutine also
	// takes costs a cache-line transfer between cores per batch.
	remotes atomic.Pointer[[]*region] // imported regions; replaced, never changed
	down    atomic.Bool               // closed (set under mu)
}

var _ rdma.Endpoint = (*Endpoint)(nil)

// Import resolves a region descriptor of the peer node.
func (e *Endpoint) Import(d rdma.RegionDesc) (rdma.RemoteKey, error) {
	if len(d.Key) != 4 {
		return 0, errors.Mark(errors.Newf("loopback: remote key of %d bytes, want 4", len(d.Key)), rdma.ErrInvalidWrite)
	}
	r := e.to.region(rdma.LocalKey(binary.LittleEndian.Uint32(d.Key)))
	if r == nil || r.addr != d.Addr || r.len != d.Len {
		return 0, errors.Mark(errors.Newf("loopback: node %s has no region [%#x, +%d) with that key", e.to.name, d.Addr, d.Len), rdma.ErrInvalidWrite)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var rs []*region
	if p := e.remotes.Load(); p != nil {
		rs = *p
	}
	rs = append(rs[:len(rs):len(rs)], r)
	e.remotes.Store(&rs)
	return rdma.RemoteKey(len(rs) - 1), nil
}

// Post validates the writes, stamps the batch on the sending node's link and
// either copies its bytes at once (unmodeled, or no time to spare) or reads
// its sources into staging for the link to copy; the link reports the batch
// at its landing instant.
func (e *Endpoint) Post(ws []rdma.Write, done func(error)) error {
	t := e.from
	fast := t.out.unmodeled && !t.out.stamps
	if fast && len(ws) <= directWrites {
		// The direct path's common case needs no batch record at all.
		var srcs, dsts [directWrites][]byte
		if _, err := e.resolve(ws, srcs[:len(ws)], dsts[:len(ws)]); err != nil {
			return err
		}
		if !hasDevice(srcs[:len(ws)], ws) {
			if e.down.Load() || e.to.isClosed() {
				return e.refuse()
			}
			return e.postDirect(srcs[:len(ws)], dsts[:len(ws)], done)
		}
	}
	b := newBatch(len(ws))
	total, err := e.resolve(ws, b.srcs, b.dsts)
	if err != nil {
		recycle(b)
		return err
	}
	if e.down.Load() || e.to.isClosed() {
		recycle(b)
		return e.refuse()
	}
	if fast && !hasDevice(b.srcs, ws) {
		err := e.postDirect(b.srcs, b.dsts, done)
		recycle(b)
		return err
	}
	b.ep, b.done = e, done
	b.writes = append(b.writes, ws...)
	b.info = BatchInfo{From: t.name, To: e.to.name, Seq: t.out.seq.Add(1), Bytes: total, Writes: len(ws)}
	if len(ws) > 0 {
		b.info.Dst = ws[0].Dst
	}
	var slow Slowdown
	if f := t.fab.opts.Slow; f != nil {
		slow = f(b.info)
	}
	// Copy now when the batch lands at once, or when its copy must start
	// now to be in place by its landing instant (the emulator's copy is not
	// to delay modeled time); else stage it and let the link copy it just
	// ahead of its instant.
	var direct bool
	if t.out.unmodeled {
		// Nothing delays a batch: it lands now, and only the hooks want
		// the clock (a clock read is a tenth of a 64 KiB batch's cost).
		if t.out.stamps {
			b.posted = time.Now()
			b.landAt = b.posted
		}
		direct = true
	} else {
		now := t.out.schedule(b, slow)
		direct = now || (t.out.lead(total) >= b.landAt.Sub(b.posted) && t.out.staged.Load() == 0)
	}
	if !direct || hasDevice(b.srcs, ws) {
		// A real NIC may read the sources any time after the post: read
		// them now, the strictest test of write-before-read. Device memory
		// is read (DtoH) here in any case.
		if err := e.stage(b, total); err != nil {
			recycle(b)
			return err
		}
	}
	if direct {
		err = e.landNow(b)
	} else {
		b.copyAt = b.landAt.Add(-t.out.lead(total))
		if err = e.admit(b); err == nil {
			t.out.staged.Add(1)
		}
	}
	if err != nil {
		recycle(b)
		return err
	}
	t.out.enqueue(b)
	return nil
}

// postDirect is Post on an unmodeled link without hooks, the path of the
// embedded default and of every memcpy-bound use: the bytes are copied
// here, under landMu (the barrier Close waits on), and only the completion
// goes to the link goroutine, which the contract wants to run done. No
// batch record, lock or clock is shared with the link goroutine but the
// completion queue: on two cores every cache line the two goroutines
// both write costs about as much as a tenth of a 64 KiB copy.
func (e *Endpoint) postDirect(srcs, dsts [][]byte, done func(error)) error {
	t := e.from
	e.landMu.Lock()
	e.to.inbound.RLock()
	if e.down.Load() {
		e.to.inbound.RUnlock()
		e.landMu.Unlock()
		return e.refuse()
	}
	var err error
	if e.to.isClosed() {
		err = errors.Mark(errors.Newf("loopback: a batch %s->%s: the peer is gone", t.name, e.to.name), rdma.ErrEndpointBroken)
	} else {
		for i, dst := range dsts {
			copy(dst, srcs[i])
		}
	}
	t.out.complete(completion{ep: e, done: done, err: err})
	e.to.inbound.RUnlock()
	e.landMu.Unlock()
	t.out.wakeIfIdle()
	return nil
}

// directWrites is how many writes a direct batch may have for its
// resolved bytes to live on Post's stack.
const directWrites = 8

// stage reads the batch's sources into a staging buffer.
func (e *Endpoint) stage(b *batch, total uint64) error {
	b.staged = getStage(total)
	for i, s := range b.srcs {
		if s != nil || b.writes[i].Len == 0 {
			b.staged = append(b.staged, s...)
			continue
		}
		off := len(b.staged)
		b.staged = b.staged[:off+int(b.writes[i].Len)]
		if err := e.from.fab.opts.ReadDevice(b.staged[off:], b.writes[i].Src); err != nil {
			return errors.Mark(errors.Wrapf(err, "loopback: read write %d's source from device memory", i), rdma.ErrInvalidWrite)
		}
	}
	return nil
}

// admit records b as pending, checked again under the lock that Close
// takes: a Close since Post's first check must not find a batch it did not
// fail.
func (e *Endpoint) admit(b *batch) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return e.closedErr()
	}
	e.pending[b] = struct{}{}
	return nil
}

// landNow admits b and copies its bytes on the poster's goroutine; the link
// only reports it, at its landing instant. Not yet on the queue, so nothing but Close sees the
// batch, and a Close waits for landMu: then the copy is over.
func (e *Endpoint) landNow(b *batch) error {
	e.landMu.Lock()
	defer e.landMu.Unlock()
	e.to.inbound.RLock()
	defer e.to.inbound.RUnlock()
	if err := e.admit(b); err != nil {
		return err
	}
	if b.err = e.fate(b); b.err == nil {
		e.copyBytes(b)
	}
	b.applied = true
	return nil
}

// refuse returns why the endpoint takes no more batches, or nil.
func (e *Endpoint) refuse() error {
	if e.to.isClosed() {
		return errors.Mark(errors.Newf("loopback: peer %s is gone", e.to.name), rdma.ErrEndpointBroken)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return e.closedErr()
	}
	return nil
}

func (e *Endpoint) closedErr() error {
	return e.mark(errors.Newf("loopback: endpoint %s->%s closed%s", e.from.name, e.to.name, e.why))
}

// mark marks err rdma.ErrEndpointBroken, and rdma.ErrRevoked when the
// peer's revocation closed the endpoint: a fresh endpoint would not reach
// it either, so callers do not re-send.
func (e *Endpoint) mark(err error) error {
	err = errors.Mark(err, rdma.ErrEndpointBroken)
	if e.revoked {
		err = errors.Mark(err, rdma.ErrRevoked)
	}
	return err
}

// resolve checks every write against the registered regions, the way a NIC's
// protection check would, and fills srcs and dsts with the source and
// destination bytes.
func (e *Endpoint) resolve(ws []rdma.Write, srcs, dsts [][]byte) (total uint64, err error) {
	var src, dst *region
	var remotes []*region
	if p := e.remotes.Load(); p != nil {
		remotes = *p
	}
	locals := *e.from.regions.Load()
	for i, w := range ws {
		if src == nil || src.key != w.Local {
			if src = locals[w.Local]; src == nil {
				return 0, errors.Mark(errors.Newf("loopback: write %d: unknown local key %d", i, w.Local), rdma.ErrInvalidWrite)
			}
		}
		if !src.contains(w.Src, w.Len) {
			return 0, errors.Mark(errors.Newf("loopback: write %d: source [%#x, +%d) outside its region [%#x, +%d)", i, w.Src, w.Len, src.addr, src.len), rdma.ErrInvalidWrite)
		}
		if int(w.Remote) >= len(remotes) {
			return 0, errors.Mark(errors.Newf("loopback: write %d: remote key %d not imported", i, w.Remote), rdma.ErrInvalidWrite)
		}
		dst = remotes[w.Remote]
		if !dst.contains(w.Dst, w.Len) {
			return 0, errors.Mark(errors.Newf("loopback: write %d: destination [%#x, +%d) outside its region [%#x, +%d)", i, w.Dst, w.Len, dst.addr, dst.len), rdma.ErrInvalidWrite)
		}
		if dst.device {
			return 0, errors.Mark(errors.Newf("loopback: write %d: destination %#x is device memory, which this transport can only read", i, w.Dst), rdma.ErrInvalidWrite)
		}
		srcs[i], dsts[i] = src.slice(w.Src, w.Len), dst.slice(w.Dst, w.Len)
		total += w.Len
	}
	return total, nil
}

// hasDevice reports whether a write's source is device memory (resolve
// leaves its bytes nil).
func hasDevice(srcs [][]byte, ws []rdma.Write) bool {
	for i, s := range srcs {
		if s == nil && ws[i].Len > 0 {
			return true
		}
	}
	return false
}

// Close fails every batch not yet reported; after it returns nothing of
// this endpoint lands.
func (e *Endpoint) Close() error { return e.closeWith("", false) }

// closeWith is Close, saying why in the errors of later posts and of the
// batches it fails when reason is not empty.
func (e *Endpoint) closeWith(reason string, revoked bool) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		// Another Close is under way: this one too returns only once no
		// copy is.
		e.landMu.Lock()
		e.landMu.Unlock()
		return nil
	}
	e.closed = true
	e.revoked = revoked
	if reason != "" {
		e.why = ": " + reason
	}
	e.down.Store(true)
	var failed []*batch
	for b := range e.pending {
		if !b.reported {
			b.reported = true
			failed = append(failed, b)
		}
	}
	e.pending = nil
	e.mu.Unlock()
	e.landMu.Lock() // wait for a copy under way: then nothing more lands
	e.landMu.Unlock()
	direct := e.from.out.cancel(e) // completions of landed direct batches
	e.from.forget(e)
	if e.via != nil {
		e.via.leave(e)
	}
	for _, b := range failed {
		b.done(e.mark(errors.Newf("loopback: batch %d %s->%s: endpoint torn down%s", b.info.Seq, b.info.From, b.info.To, e.why)))
	}
	for _, c := range direct {
		err := c.err
		if err == nil {
			err = e.mark(errors.Newf("loopback: a batch %s->%s: endpoint torn down before its completion%s", e.from.name, e.to.name, e.why))
		}
		c.done(err)
	}
	return nil
}
