//go:build ucx

package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// Endpoint is one ucp_ep_h to a peer worker.
type Endpoint struct {
	t        *Transport
	id       uint64
	rec      *C.kvs_ep_t   // C memory: UCX's error handler and close callback argument
	closedCh chan struct{} // closed once UCX released the endpoint
	addrKey  string        // the address connected to, the key of epochs
	epochs   *epochs       // that address's epoch count

	// Guarded by t.mu.
	remotes    []remote
	err        error // non-nil once Post must refuse: broken or closed
	userClosed bool

	// Owned by the progress goroutine; closeErr is read by Close after
	// closedCh is closed.
	lstate        epState
	drainDeadline time.Time
	closeErr      error
	// awaiting counts the groups whose FLUSH the peer has not answered:
	// until it did, their message writes may still be applied, so a
	// drain waits for them as well as for its flush (drainFlushed).
	awaiting     int
	drainFlushed bool
	// broken: the connection failed (doc.go, "Epochs"); its epoch was
	// counted and closeErr says what may still land.
	broken bool
}

// epochs is one peer address's epoch count (doc.go, "Epochs").
type epochs struct {
	n      atomic.Uint32 // endpoints to the address that broke: the epoch stamped on writes
	fenced atomic.Bool   // the address (fencesEpochs), or an answer from it, says its receiver fences epochs
	refs   int           // endpoints to the address not closed yet; guarded by Transport.mu
}

// atLeast raises the epoch count to f (a receiver's fence), never lowers it.
func (p *epochs) atLeast(f uint32) {
	for n := p.n.Load(); n < f && !p.n.CompareAndSwap(n, f); n = p.n.Load() {
	}
}

// bump counts one more broken endpoint, saturating (a peer's fence may
// have raised the count to the top: it never wraps to 0).
func (p *epochs) bump() {
	for n := p.n.Load(); n < ^uint32(0) && !p.n.CompareAndSwap(n, n+1); n = p.n.Load() {
	}
}

// broke counts e's failure in its address's epochs, on the progress
// goroutine, before any of its batches reports it: every group started
// afterwards to that address carries a later epoch. In WriteMessages the
// receiver applies what arrived of e's connection whenever its progress
// gets to it, after e is closed too, so e's Close and the batches it fails
// say ErrNotQuiesced; and ErrFenced where the receiver fences, since then
// a later epoch landing ends that.
func (t *Transport) broke(e *Endpoint) {
	if e.broken || t.opts.Writes != WriteMessages || e.lstate == epClosing || e.lstate == epClosed {
		// Once this side force-closed it (its drain done or timed out,
		// its access revoked), what fails are its own cancellations.
		return
	}
	e.broken = true
	e.epochs.bump()
	if e.closeErr != nil {
		return
	}
	if e.epochs.fenced.Load() {
		e.closeErr = errors.Mark(errors.Mark(errors.Newf("ucx: endpoint %d broke: what its connection carried may still be applied by the receiver until a later batch to it lands (epoch %d)", e.id, e.epochs.n.Load()), rdma.ErrNotQuiesced), rdma.ErrFenced)
	} else {
		e.closeErr = errors.Mark(errors.Newf("ucx: endpoint %d broke: what its connection carried may still be applied by the receiver, which does not fence epochs", e.id), rdma.ErrNotQuiesced)
	}
	e.closeErr = errors.Mark(e.closeErr, rdma.ErrEndpointBroken)
}

type epState int

const (
	epOpen epState = iota
	epDraining
	epClosing
	epClosed
)

// remote is one imported region: its bounds for validation in Go and its
// unpacked key, or for a region of a message-mode peer (rkey 0) its slot
// and generation in that peer's table.
type remote struct {
	addr, len uint64
	rkey      C.uint64_t
	slot, gen uint32
	secret    uint64 // a message key's (parseMessageKey)
}

// batch is one Post on its way through the progress goroutine. Batches and
// their C records are recycled, so that Post allocates nothing once warm.
type batch struct {
	id   uint64
	ep   *Endpoint
	ws   []C.kvs_write_t
	done func(error)
	req  *C.kvs_req_t
	slot uint32 // the record's index in Transport.slots, for its life

	// Set on the progress goroutine by startGroup.
	putErr    C.ucs_status_t // the first put of the batch that failed to start
	followers []*batch       // batches posted before this one and flushed with it
	live      bool           // started and not reported yet

	// A leader whose group had message writes waits for the peer's answer
	// to its FLUSH (needAck) as well as for its flush: the group reports
	// once both arrived, or at once when the flush failed.
	needAck, acked, flushOK bool
	ackSt                   C.ucs_status_t
}

// A flush's event names its leader by a tag: the record's slot above
// tagShift, the low bits of the batch's id below. The slot finds the record
// without a map (a map's insert and delete cost a tenth of the progress
// goroutine's time at small batches); the id bits tell a record reused
// since from the batch the event is for.
const (
	tagShift = 40
	maxSlots = 1 << (64 - tagShift)
)

func (b *batch) tag() uint64 { return uint64(b.slot)<<tagShift | b.id&(1<<tagShift-1) }

// inFlight returns the started, unreported batch that tag names, or nil
// (failed by its endpoint's teardown already).
func (t *Transport) inFlight(tag uint64) *batch {
	if s := tag >> tagShift; s < uint64(len(t.slots)) {
		if b := t.slots[s]; b != nil && b.live && b.tag() == tag {
			return b
		}
	}
	return nil
}

// setLive marks b started (live) or reported, keeping the count of live
// batches.
func (t *Transport) setLive(b *batch, live bool) {
	if b.live == live {
		return
	}
	b.live = live
	if live {
		t.live++
		for int(b.slot) >= len(t.slots) {
			t.slots = append(t.slots, nil)
		}
		t.slots[b.slot] = b
	} else {
		t.live--
	}
}

var _ rdma.Endpoint = (*Endpoint)(nil)

// Connect creates an endpoint to the worker or access point whose Address
// is addr: an access point's listener (UCX's client-server connection
// establishment, doc.go "Connection setup"), or a worker address. UCX
// connects in the background: an unreachable peer may only show as a
// failed batch.
func (t *Transport) Connect(addr []byte) (rdma.Endpoint, error) {
	var lip netip.Addr
	var lport uint16
	fences := fencesEpochs(addr)
	waddr := bytes.TrimPrefix(addr, accessMagic)
	if isListenAddr(addr) {
		var err error
		if lip, lport, err = decodeListenAddr(addr); err != nil {
			return nil, errors.Mark(err, rdma.ErrEndpointBroken)
		}
		if v := ucxVersion(); t.opts.Writes == WriteRMA && assertsOnEarlyKeys(v) {
			return nil, errors.Mark(errors.Newf("ucx: connect to %v: an access point's listener, and UCX %d.%d asserts on a put through a client-server endpoint whose remote key was unpacked before its setup completed (proto_common.inl:219), which aborts this process; in WriteRMA the access point must give out its worker address (AccessAuto or AccessWorkerAddress)",
				netip.AddrPortFrom(lip, lport), v[0], v[1]), rdma.ErrEndpointBroken)
		}
	} else if err := checkWorkerAddress(waddr); err != nil {
		return nil, errors.Mark(err, rdma.ErrEndpointBroken)
	}
	e := &Endpoint{t: t, closedCh: make(chan struct{})}
	err := t.do(func() error {
		rec := (*C.kvs_ep_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvs_ep_t{}))))
		if rec == nil {
			return errors.New("ucx: connect: out of memory")
		}
		t.nextEp++
		e.id = t.nextEp
		rec.id = C.uint64_t(e.id)
		var st C.ucs_status_t
		if lip.IsValid() {
			cip := C.CString(lip.String())
			st = C.kvs_ep_connect(t.ctx, rec, cip, cBool(lip.Is6()), C.uint16_t(lport))
			C.free(unsafe.Pointer(cip))
		} else {
			// The address is copied to C memory: UCX parses it during the
			// call but keeps nothing.
			caddr := C.CBytes(waddr)
			st = C.kvs_ep_create(t.ctx, rec, caddr)
			C.free(caddr)
		}
		if st != C.UCS_OK {
			C.free(unsafe.Pointer(rec))
			return errors.Mark(statusErr(st, "ucx: connect"), rdma.ErrEndpointBroken)
		}
		e.rec = rec
		t.eprecs = append(t.eprecs, rec)
		t.eps[e.id] = e
		e.addrKey = string(addr)
		t.mu.Lock()
		if e.epochs = t.epochs[e.addrKey]; e.epochs == nil {
			e.epochs = &epochs{}
			e.epochs.fenced.Store(fences)
			t.epochs[e.addrKey] = e.epochs
		}
		e.epochs.refs++
		t.mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Bounds of a packed worker address (UCX 1.x, ucp/core/ucp_address.c):
// the low four bits of its first byte are the format version, V1 (0) or V2
// (1). UCX asserts on any other version inside ucp_ep_create, aborting the
// process, so a peer's garbage must be refused before it gets there.
const (
	maxWorkerAddress   = 64 << 10
	addressVersionMask = 0x0f
	addressVersionMax  = 1
)

// checkWorkerAddress is the structural check of a peer's worker address that
// keeps UCX from aborting on it. Random addresses of a valid version were
// refused by UCX with an error (tried: random bytes of every length up to
// 78 with either version); the rest of the format is parsed by UCX and
// trusted to come from an authenticated peer.
func checkWorkerAddress(addr []byte) error {
	switch {
	case len(addr) < 2 || len(addr) > maxWorkerAddress:
		return errors.Newf("ucx: connect: a worker address of %d bytes (want 2 to %d)", len(addr), maxWorkerAddress)
	case addr[0]&addressVersionMask > addressVersionMax:
		return errors.Newf("ucx: connect: worker address format version %d unknown (want 0 or 1)", addr[0]&addressVersionMask)
	}
	return nil
}

// checkPackedKey is the structural check of a peer's packed remote key that
// keeps the malformed ones UCX asserts on (over shared memory, UCX 1.13
// aborts inside ucp_ep_rkey_unpack on random bytes) from reaching it. The
// format (ucp_rkey_pack_memh): the 64-bit map of memory domains, one byte
// of memory type, then per domain in the map a length byte and that many
// bytes of the domain's key; system-device distances may follow. What each
// domain's bytes say is parsed by UCX and trusted to come from the
// authenticated peer.
func checkPackedKey(key []byte) error {
	const head = 9
	if len(key) < head || len(key) > maxPackedKey {
		return errors.Newf("a packed key of %d bytes (want %d to %d)", len(key), head, maxPackedKey)
	}
	mdMap := binary.LittleEndian.Uint64(key)
	if mdMap == 0 {
		return errors.New("a packed key for no memory domain")
	}
	if memType := key[8]; int(memType) >= int(C.UCS_MEMORY_TYPE_LAST) {
		return errors.Newf("a packed key of memory type %d unknown", memType)
	}
	p := head
	for range bits.OnesCount64(mdMap) {
		if p >= len(key) {
			return errors.Newf("a packed key of %d bytes ends within its %d domains' keys", len(key), bits.OnesCount64(mdMap))
		}
		p += 1 + int(key[p])
		if p > len(key) {
			return errors.Newf("a packed key of %d bytes ends within a domain's key", len(key))
		}
	}
	return nil
}

// maxPackedKey bounds a packed remote key.
const maxPackedKey = 64 << 10

// Import unpacks a peer region's remote key on this endpoint.
func (e *Endpoint) Import(d rdma.RegionDesc) (rdma.RemoteKey, error) {
	if len(d.Key) == 0 || d.Len == 0 || d.Addr+d.Len < d.Addr {
		return 0, errors.Mark(errors.Newf("ucx: import [%#x, +%d) with a %d-byte key: malformed descriptor", d.Addr, d.Len, len(d.Key)), rdma.ErrInvalidWrite)
	}
	t := e.t
	if slot, gen, secret, ok := parseMessageKey(d.Key); ok {
		t.mu.Lock()
		defer t.mu.Unlock()
		if e.err != nil {
			return 0, errors.Mark(e.err, rdma.ErrEndpointBroken)
		}
		e.remotes = append(e.remotes, remote{addr: d.Addr, len: d.Len, slot: slot, gen: gen, secret: secret})
		return rdma.RemoteKey(len(e.remotes) - 1), nil
	}
	if t.opts.Writes != WriteRMA {
		return 0, errors.Mark(errors.Newf("ucx: import [%#x, +%d): the peer offers a UCX remote key (its memory takes RMA puts), and this transport writes with messages (Options.Writes); start both sides in the same write mode", d.Addr, d.Len), rdma.ErrInvalidWrite)
	}
	if err := checkPackedKey(d.Key); err != nil {
		return 0, errors.Mark(errors.Wrapf(err, "ucx: import [%#x, +%d)", d.Addr, d.Len), rdma.ErrInvalidWrite)
	}
	var rk rdma.RemoteKey
	err := t.do(func() error {
		if e.lstate != epOpen {
			return e.postErr()
		}
		ckey := C.CBytes(d.Key)
		var h C.uint64_t
		st := C.kvs_rkey_unpack(e.rec, ckey, &h)
		C.free(ckey)
		if st != C.UCS_OK {
			return errors.Mark(statusErr(st, "ucx: import [%#x, +%d)", d.Addr, d.Len), rdma.ErrInvalidWrite)
		}
		t.mu.Lock()
		e.remotes = append(e.remotes, remote{addr: d.Addr, len: d.Len, rkey: h})
		rk = rdma.RemoteKey(len(e.remotes) - 1)
		t.mu.Unlock()
		return nil
	})
	return rk, err
}

// postErr is why Post refuses, marked ErrEndpointBroken.
func (e *Endpoint) postErr() error {
	e.t.mu.Lock()
	err := e.err
	e.t.mu.Unlock()
	if err == nil {
		err = errors.Newf("ucx: endpoint %d closed", e.id)
	}
	return errors.Mark(err, rdma.ErrEndpointBroken)
}

// Post validates the writes against the registered and imported regions,
// queues the batch for the progress goroutine and returns. done runs there,
// after the batch's flush completed or failed.
func (e *Endpoint) Post(ws []rdma.Write, done func(error)) error {
	if done == nil {
		return errors.Mark(errors.New("ucx: post: nil done"), rdma.ErrInvalidWrite)
	}
	t := e.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.Mark(ErrClosed, rdma.ErrEndpointBroken)
	}
	if e.err != nil {
		return errors.Mark(e.err, rdma.ErrEndpointBroken)
	}
	var b *batch
	if n := len(t.free); n > 0 {
		b, t.free = t.free[n-1], t.free[:n-1]
	} else {
		if len(t.reqs) >= maxSlots {
			// A tag has no room for more: refuse rather than let an
			// event name the wrong record.
			return errors.Mark(errors.Newf("ucx: post: %d batch records, the most a flush's tag can name", len(t.reqs)), rdma.ErrEndpointBroken)
		}
		b = &batch{req: (*C.kvs_req_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvs_req_t{}))))}
		if b.req == nil {
			return errors.New("ucx: post: out of memory")
		}
		b.slot = uint32(len(t.reqs))
		t.reqs = append(t.reqs, b.req) // freed by teardown, after the worker
	}
	b.ws = b.ws[:0]
	var src *region
	for i, w := range ws {
		if src == nil || src.key != w.Local {
			if src = t.regions[w.Local]; src == nil {
				t.free = append(t.free, b)
				return errors.Mark(errors.Newf("ucx: write %d: unknown local key %d", i, w.Local), rdma.ErrInvalidWrite)
			}
		}
		if !contains(src.addr, src.len, w.Src, w.Len) {
			t.free = append(t.free, b)
			return errors.Mark(errors.Newf("ucx: write %d: source [%#x, +%d) outside its region [%#x, +%d)", i, w.Src, w.Len, src.addr, src.len), rdma.ErrInvalidWrite)
		}
		if int(w.Remote) >= len(e.remotes) {
			t.free = append(t.free, b)
			return errors.Mark(errors.Newf("ucx: write %d: remote key %d not imported", i, w.Remote), rdma.ErrInvalidWrite)
		}
		dst := &e.remotes[w.Remote]
		if !contains(dst.addr, dst.len, w.Dst, w.Len) {
			t.free = append(t.free, b)
			return errors.Mark(errors.Newf("ucx: write %d: destination [%#x, +%d) outside its region [%#x, +%d)", i, w.Dst, w.Len, dst.addr, dst.len), rdma.ErrInvalidWrite)
		}
		b.ws = append(b.ws, C.kvs_write_t{
			src:    C.uint64_t(w.Src),
			dst:    C.uint64_t(w.Dst),
			len:    C.uint64_t(w.Len),
			rkey:   dst.rkey,
			memh:   C.uint64_t(uintptr(unsafe.Pointer(src.memh))),
			slot:   C.uint32_t(dst.slot),
			gen:    C.uint32_t(dst.gen),
			secret: C.uint64_t(dst.secret),
		})
	}
	t.nextBatch++
	b.id, b.ep, b.done = t.nextBatch, e, done
	t.enqueueLocked(item{b: b})
	return nil
}

func contains(base, n, addr, l uint64) bool {
	return addr >= base && l <= n && addr-base <= n-l
}

// maxGroup bounds the batches one flush completes: a flush's completion
// reports them all, so a large group would hold back the first ones.
const maxGroup = 64

// startGroup posts the puts of batches queued one after the other for the
// same endpoint, then one flush for them all (kvs_post); it runs on the
// progress goroutine. The last batch's record is the flush's, and carries
// the others as followers.
func (t *Transport) startGroup(bs []*batch) {
	e := bs[0].ep
	if e.lstate != epOpen {
		// Queued before the endpoint broke or closed: they never start.
		for _, b := range bs {
			// Wrapped, not formatted: the endpoint's reason keeps its
			// marks (a refused connection is a revocation).
			t.complete(b, errors.Wrapf(e.postErr(), "ucx: batch %d", b.id), true)
		}
		return
	}
	t.gws, t.gcounts = t.gws[:0], t.gcounts[:0]
	for _, b := range bs {
		t.setLive(b, true)
		t.gws = append(t.gws, b.ws...)
		t.gcounts = append(t.gcounts, C.uint32_t(len(b.ws)))
	}
	if cap(t.gerrs) < len(bs) {
		t.gerrs = make([]C.int32_t, len(bs))
	}
	t.gerrs = t.gerrs[:len(bs)]
	leader := bs[len(bs)-1]
	leader.req.id = C.uint64_t(leader.tag())
	leader.followers = append(leader.followers[:0], bs[:len(bs)-1]...)
	var ws *C.kvs_write_t
	if len(t.gws) > 0 {
		ws = &t.gws[0] // Go memory without Go pointers, used during the call only
	}
	leader.needAck, leader.acked, leader.flushOK, leader.ackSt = false, false, false, C.UCS_OK
	leader.req.epoch = C.uint32_t(e.epochs.n.Load())
	if C.kvs_post(t.ctx, e.rec, ws, &t.gcounts[0], &t.gerrs[0], C.size_t(len(bs)), leader.req) != 0 {
		leader.needAck = true
		e.awaiting++
	}
	t.flushes.Add(1)
	for i, b := range bs {
		b.putErr = C.ucs_status_t(t.gerrs[i])
	}
}

// flushDone takes a group's flush: it reports the group unless it still
// waits for the peer's answer to its FLUSH. A failed flush reports at once
// (no answer is coming from a broken endpoint).
func (t *Transport) flushDone(leader *batch, st C.ucs_status_t) {
	if st == C.UCS_OK && leader.needAck && !leader.acked {
		leader.flushOK = true
		return
	}
	if st == C.UCS_OK && !leader.needAck && leader.ep.lstate >= epClosing {
		// The endpoint's forced close began with the batch in flight, and
		// no peer's answer confirms its writes: UCX may complete a flush
		// the close cut short (over shared memory a put to a peer that is
		// gone is a copy into a segment only this side still maps).
		// kvs_ep_close queues the close's event before the progress that
		// settles it, so finishClose has failed such a batch already; this
		// holds whatever order the events come in. finishClose fails the
		// batch, as Close says.
		return
	}
	if st == C.UCS_OK {
		st = leader.ackSt
	} else if st != C.UCS_ERR_REJECTED {
		// REJECTED: the access point's listener refused the connection
		// (revoked, or at its limit), so nothing of it was applied.
		t.broke(leader.ep)
	}
	t.flushed(leader, st)
}

// ackDone takes the peer's answer to a group's FLUSH: every write before
// it was applied (UCS_OK), or refused (its access revoked, a region it no
// longer holds). The group reports once its flush completed too: the
// record and the messages' headers stay in use until then.
func (t *Transport) ackDone(leader *batch, st C.ucs_status_t) {
	e := leader.ep
	leader.acked, leader.ackSt = true, st
	e.awaiting--
	// A refusal closes the endpoint before its batches report, so that a
	// caller posting again once its batch failed finds it closed.
	switch st {
	case C.UCS_OK:
	case C.UCS_ERR_REJECTED:
		// The peer revoked this side's access: its worker applies nothing
		// more of this endpoint, so it closes without a drain.
		t.startClose(e, errors.Newf("ucx: endpoint %d: the peer refused its writes (access revoked)", e.id), true)
	default:
		// A write refused (a region the peer does not hold) or of an old
		// epoch (doc.go, "Epochs"): the connection is sound and groups
		// after it may still be applied, so it drains (each of them
		// answered in turn) before it closes, and its Close then confirms
		// that nothing more of it can land.
		reason := statusErr(st, "ucx: endpoint %d: the peer refused a write", e.id)
		if st == C.KVS_STALE {
			reason = errors.Newf("ucx: endpoint %d: the peer refused writes of an old epoch (a later connection's writes landed first)", e.id)
		}
		t.startClose(e, reason, false)
	}
	if leader.flushOK {
		t.flushed(leader, st)
	}
	t.maybeDrained(e)
}

// maybeDrained closes a draining endpoint once its drain's flush completed
// and the peer answered every FLUSH sent on it: nothing it posted can land
// any more.
func (t *Transport) maybeDrained(e *Endpoint) {
	if e.lstate == epDraining && e.drainFlushed && e.awaiting == 0 {
		t.startClose(e, nil, true)
	}
}

// flushed reports a group whose flush completed with st: the followers in
// posting order, then the leader. A batch whose endpoint's teardown failed
// it already is no longer in flight and is skipped.
func (t *Transport) flushed(leader *batch, st C.ucs_status_t) {
	// refused: the peer answered the FLUSH with a refusal (whatever the
	// flush said).
	refused := leader.needAck && leader.acked && leader.ackSt != C.UCS_OK
	ackSt := leader.ackSt
	if leader.needAck && !leader.acked && leader.live {
		leader.acked = true // no answer is awaited any more
		leader.ep.awaiting--
	}
	// A done callback may Close an endpoint, which progresses the worker
	// from here and may report another group: that one must not reuse the
	// array this one iterates.
	var group []*batch
	t.flushDepth++
	if t.flushDepth == 1 {
		group = append(t.gdone[:0], leader.followers...)
	} else {
		group = append(group, leader.followers...)
	}
	group = append(group, leader)
	clear(leader.followers)
	leader.followers = leader.followers[:0]
	for _, b := range group {
		if !b.live {
			continue
		}
		t.setLive(b, false)
		var err error
		switch {
		case b.putErr != C.UCS_OK:
			t.broke(b.ep)
			err = errors.Mark(statusErr(b.putErr, "ucx: batch %d: a put did not start", b.id), rdma.ErrEndpointBroken)
		case refused && ackSt == C.UCS_ERR_REJECTED:
			err = errors.Mark(errors.Mark(errors.Newf("ucx: batch %d: the peer revoked this side's access to its memory", b.id), rdma.ErrEndpointBroken), rdma.ErrRevoked)
		case refused && ackSt == C.KVS_STALE:
			// Resumable: a fresh endpoint's writes carry the current epoch.
			err = errors.Mark(errors.Newf("ucx: batch %d: the peer refused writes of an old epoch (a later connection's writes to it landed first); re-send it", b.id), rdma.ErrEndpointBroken)
		case refused:
			err = errors.Mark(errors.Mark(statusErr(ackSt, "ucx: batch %d: the peer refused a write (a region it does not hold)", b.id), rdma.ErrEndpointBroken), rdma.ErrRevoked)
		case st == C.UCS_ERR_REJECTED:
			err = errors.Mark(errors.Mark(statusErr(st, "ucx: batch %d: the peer refused the connection", b.id), rdma.ErrEndpointBroken), rdma.ErrRevoked)
		case st != C.UCS_OK:
			err = errors.Mark(statusErr(st, "ucx: batch %d", b.id), rdma.ErrEndpointBroken)
		}
		t.complete(b, err, true)
	}
	clear(group)
	if t.flushDepth--; t.flushDepth == 0 {
		t.gdone = group[:0]
	}
}

// startClose tears an endpoint down. Unless force is set (or
// Options.CloseDrain is negative) it first drains: one more flush, so that
// every write already handed to UCX has landed or failed before the forced
// close. That is what makes Close a barrier where the receiver applies the
// writes (UCX emulates puts with messages over TCP and shared memory): a
// forced close alone cancels only what UCX has not sent yet, while bytes in
// socket buffers or shared-memory FIFOs are still written at the target
// afterwards. The forced close (UCP_EP_CLOSE_FLAG_FORCE) then releases the
// endpoint without waiting for the peer, which may be gone.
func (t *Transport) startClose(e *Endpoint, reason error, force bool) {
	switch e.lstate {
	case epOpen:
		t.mu.Lock()
		if e.err == nil {
			e.err = reason
		}
		t.mu.Unlock()
		if !force && t.opts.CloseDrain > 0 {
			e.lstate = epDraining
			e.drainDeadline = time.Now().Add(t.opts.CloseDrain)
			t.draining++
			C.kvs_ep_drain(t.ctx, e.rec) // always queues KVS_EV_EP_DRAINED
			return
		}
	case epDraining:
		if !force {
			return
		}
		t.draining--
	default:
		return
	}
	e.lstate = epClosing
	C.kvs_ep_close(t.ctx, e.rec) // always queues KVS_EV_EP_CLOSED
}

// checkDrains forces the endpoints whose drain outlived Options.CloseDrain:
// the peer is gone or stuck. Their Close reports that writes may still land.
func (t *Transport) checkDrains() {
	if t.draining == 0 {
		return
	}
	now := time.Now()
	for _, e := range t.eps {
		if e.lstate == epDraining && now.After(e.drainDeadline) {
			e.closeErr = errors.Mark(errors.Newf("ucx: endpoint %d: writes still in flight %v after Close; forced closed, so they may still land", e.id, t.opts.CloseDrain), rdma.ErrEndpointBroken)
			e.closeErr = errors.Mark(e.closeErr, rdma.ErrNotQuiesced)
			t.startClose(e, nil, true)
		}
	}
}

// finishClose runs once UCX released the endpoint: nothing of it can be
// started or land from this side any more, so its unfinished batches fail.
func (t *Transport) finishClose(e *Endpoint) {
	switch e.lstate {
	case epClosed:
		return
	case epDraining:
		t.draining--
	}
	e.lstate = epClosed
	delete(t.eps, e.id)
	t.mu.Lock()
	if e.epochs.refs--; e.epochs.refs == 0 && e.epochs.n.Load() == 0 {
		delete(t.epochs, e.addrKey)
	}
	remotes := e.remotes
	e.remotes = nil
	if e.err == nil {
		e.err = errors.Newf("ucx: endpoint %d closed", e.id)
	}
	reason := e.err
	t.mu.Unlock()
	for _, r := range remotes {
		if r.rkey != 0 { // a message-mode region's has none
			C.kvs_rkey_destroy(r.rkey)
		}
	}
	var failed []*batch
	for _, b := range t.slots {
		if b != nil && b.live && b.ep == e {
			t.setLive(b, false)
			failed = append(failed, b)
		}
	}
	for _, b := range failed {
		// Its flush may still call back (and is ignored then), so the
		// record is not reused.
		t.complete(b, errors.Mark(errors.Newf("ucx: batch %d: endpoint torn down: %v", b.id, reason), rdma.ErrEndpointBroken), false)
	}
	// After the failures were reported, so that Close's caller sees them
	// first.
	close(e.closedCh)
}

// Close drains the endpoint (up to Options.CloseDrain), force-closes it and
// waits until UCX released it. Batches that completed during the drain
// report success; the others fail with rdma.ErrEndpointBroken. When Close
// returns nil, no write posted on the endpoint can land any more; when the
// drain timed out, or UCX did not release the endpoint in time, it returns
// an error marked rdma.ErrEndpointBroken and rdma.ErrNotQuiesced, because
// writes already sent may still be applied by the peer, and the batches it
// failed report errors marked rdma.ErrNotQuiesced too.
func (e *Endpoint) Close() error {
	t := e.t
	t.mu.Lock()
	first := !e.userClosed
	e.userClosed = true
	if e.err == nil {
		e.err = errors.Newf("ucx: endpoint %d closed", e.id)
	}
	onLoop := t.onLoop()
	if first && !t.closed && !onLoop {
		t.enqueueLocked(item{fn: func() { t.startClose(e, nil, false) }})
	}
	t.mu.Unlock()
	timeout := max(t.opts.CloseDrain, 0) + t.opts.CloseTimeout
	tooLong := errors.Mark(errors.Mark(errors.Newf("ucx: endpoint %d: close did not complete in %v, so its writes may still land", e.id, timeout), rdma.ErrEndpointBroken), rdma.ErrNotQuiesced)
	if onLoop {
		if t.ctx == nil {
			return nil
		}
		t.startClose(e, nil, false)
		// Already draining (another goroutine's Close) with every FLUSH
		// answered, as when this runs in the done callback of the batch
		// whose answer was the last one awaited: no event will come to
		// say so (ackDone looks once its callbacks returned), so look now.
		t.maybeDrained(e)
		if !t.progressUntil(func() bool { return e.lstate == epClosed }, timeout) {
			return tooLong
		}
		return e.closeErr
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-e.closedCh:
		return e.closeErr
	case <-timer.C:
		return tooLong
	}
}
