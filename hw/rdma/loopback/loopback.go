// Package loopback is an in-process implementation of the rdma contract:
// regions are hostmem blocks, a write is a memcpy between them, and each
// sending node has a link that models bandwidth and latency. It is the
// embedded default, the sim's data path and the test double for real
// transports, so it keeps the contract's hard parts real: completion is
// asynchronous, a write lands no later than its batch completes, and a closed
// endpoint lands nothing more.
//
// On a modeled link (bandwidth, latency or a delaying fault) Post reads the
// sources into a staging buffer and the link lands the bytes at their
// modeled instant. On an unmodeled link there is nothing to wait for, so Post
// copies the bytes itself and the link goroutine only delivers the
// completion: a memcpy transport's work is the copy, and doing it on the
// poster's thread spares every batch a hand-off to another goroutine, which on
// two cores cost more than a 64 KiB copy (docs/TRANSPORT-BENCH.md).
//
// Faults (post errors, lost, delayed or failed completions, a vanished peer, a
// slow link) can be injected per batch for reliability tests.
package loopback

import (
	"encoding/binary"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/internal/clock"
	"github.com/kvstream/kvstream/hw/rdma"
)

// Options model the fabric.
type Options struct {
	// Bandwidth is each sending node's link rate in modeled bytes per second;
	// zero means unlimited.
	Bandwidth float64
	// Latency is added to every batch's completion.
	Latency time.Duration
	// TimeScale is modeled seconds per wall second; zero means 1.
	TimeScale float64
	// ByteScale is modeled bytes per real byte, so that a run with shrunken
	// pages keeps realistic link times; zero means 1.
	ByteScale float64
	// Faults, if set, decides per posted batch how it misbehaves.
	Faults func(BatchInfo) Fault
	// OnLand, if set, observes every write as it lands, on the goroutine
	// that lands it: the link's, or on an unmodeled link the one calling
	// Post, while the copy is under way: it must not call into the
	// transport nor take a lock that a caller of Post may hold.
	OnLand func(Landing)
	// OnBatch, if set, observes every batch that landed, like OnLand.
	OnBatch func(BatchSpan)
	// Precise lands batches at their modeled instant to within microseconds
	// (see hw/cuda/sim.Options.Precise).
	Precise bool
	// ReadDevice, if set, lets the transport register memory that is not
	// hostmem as device memory (a GPU pool) and read write sources from it,
	// the way a GPUDirect-capable NIC would: cuMemcpyDtoH into the staging
	// buffer when the batch is posted. Device memory cannot be a
	// destination here.
	ReadDevice func(dst []byte, src uint64) error
}

// BatchInfo identifies a batch for fault decisions.
type BatchInfo struct {
	From, To string
	Seq      uint64 // per sending node, from 1
	Bytes    uint64
	Writes   int
	Dst      uint64 // the first write's destination address (0 if none)
}

// Fault is how a batch misbehaves.
type Fault struct {
	Kind  FaultKind
	Delay time.Duration // for DelayCompletion and SlowLink: extra modeled time
}

// FaultKind enumerates injectable faults.
type FaultKind int

const (
	// NoFault: the batch lands and completes normally.
	NoFault FaultKind = iota
	// PostError: Post fails; nothing starts.
	PostError
	// LoseCompletion: the bytes land but done is only called when the
	// endpoint is torn down.
	LoseCompletion
	// DelayCompletion: the batch lands and completes Delay later.
	DelayCompletion
	// FailCompletion: nothing lands and done reports an error.
	FailCompletion
	// PeerGone: the batch fails as if the peer vanished, and the endpoint is
	// broken for every later batch.
	PeerGone
	// SlowLink: the batch occupies the link for Delay more.
	SlowLink
)

// String names a fault kind.
func (k FaultKind) String() string {
	return [...]string{"none", "post_error", "lose_completion", "delay_completion", "fail_completion", "peer_gone", "slow_link"}[k]
}

// ErrInjected marks failures produced by fault injection.
var ErrInjected = errors.New("loopback: injected fault")

// Landing is one write that reached its destination.
type Landing struct {
	Node   string // destination node
	Addr   uint64
	Len    uint64
	Posted time.Time // when its batch was posted
	At     time.Time // when it landed
}

// BatchSpan is one batch's life on the link.
type BatchSpan struct {
	From, To       string
	Seq            uint64
	Bytes          uint64
	Posted, Landed time.Time
}

// Fabric connects the transports of one process.
type Fabric struct {
	opts  Options
	mu    sync.Mutex
	nodes map[string]*Transport
}

// NewFabric returns an empty fabric.
func NewFabric(opts Options) *Fabric {
	if opts.TimeScale <= 0 {
		opts.TimeScale = 1
	}
	if opts.ByteScale <= 0 {
		opts.ByteScale = 1
	}
	return &Fabric{opts: opts, nodes: map[string]*Transport{}}
}

// NewTransport adds a node; its Address is its name.
func (f *Fabric) NewTransport(name string) (*Transport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == "" {
		return nil, errors.New("loopback: node name must not be empty")
	}
	if _, dup := f.nodes[name]; dup {
		return nil, errors.Newf("loopback: node %q already exists", name)
	}
	t := &Transport{fab: f, name: name, regions: map[rdma.LocalKey]*region{}, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	f.nodes[name] = t
	go t.link()
	return t, nil
}

func (f *Fabric) node(name string) *Transport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[name]
}

// Transport is one node of the fabric.
type Transport struct {
	fab  *Fabric
	name string

	mu        sync.Mutex
	regions   map[rdma.LocalKey]*region
	nextKey   rdma.LocalKey
	endpoints []*Endpoint
	// closed is written under mu (so that no region or endpoint is added
	// after Close) and read without it: landing checks the peer while
	// holding an endpoint's lock, and a node may connect to itself.
	closed atomic.Bool

	// inbound is held for reading across every copy into this node's
	// memory, and taken for writing by Close once closed is set: after
	// Close returns no other node's write lands here.
	inbound sync.RWMutex

	// the link: batches in completion order
	lmu       sync.Mutex
	queue     []*batch
	busyUntil time.Time
	seq       atomic.Uint64
	wake      chan struct{}
	stopped   chan struct{}
}

var _ rdma.Transport = (*Transport)(nil)

type region struct {
	addr, len uint64
	mem       []byte // nil for device memory
	key       rdma.LocalKey
	t         *Transport
	device    bool
}

// Name returns "loopback".
func (t *Transport) Name() string { return "loopback" }

// Address returns the node name.
func (t *Transport) Address() []byte { return []byte(t.name) }

// Register registers a range of a live hostmem block.
func (t *Transport) Register(addr, length uint64) (rdma.Region, error) {
	if length == 0 {
		return nil, errors.Mark(errors.Newf("loopback: register %#x: zero length", addr), rdma.ErrInvalidWrite)
	}
	mem, err := hostmem.Lookup(addr, length)
	device := false
	if err != nil {
		if t.fab.opts.ReadDevice == nil {
			return nil, errors.Mark(errors.Wrap(err, "loopback: register (memory must come from hostmem)"), rdma.ErrInvalidWrite)
		}
		device, mem = true, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil, errors.Mark(errors.Newf("loopback: node %s closed", t.name), rdma.ErrEndpointBroken)
	}
	t.nextKey++
	r := &region{addr: addr, len: length, mem: mem, key: t.nextKey, t: t, device: device}
	t.regions[r.key] = r
	return r, nil
}

func (r *region) Desc() rdma.RegionDesc {
	key := make([]byte, 4)
	binary.LittleEndian.PutUint32(key, uint32(r.key))
	return rdma.RegionDesc{Addr: r.addr, Len: r.len, Key: key}
}

func (r *region) Key() rdma.LocalKey { return r.key }

func (r *region) Deregister() error {
	r.t.mu.Lock()
	delete(r.t.regions, r.key)
	r.t.mu.Unlock()
	return nil
}

func (t *Transport) region(k rdma.LocalKey) *region {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.regions[k]
}

// Connect opens an endpoint to the node named addr.
func (t *Transport) Connect(addr []byte) (rdma.Endpoint, error) {
	peer := t.fab.node(string(addr))
	if peer == nil {
		return nil, errors.Mark(errors.Newf("loopback: no node %q", addr), rdma.ErrEndpointBroken)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil, errors.Mark(errors.Newf("loopback: node %s closed", t.name), rdma.ErrEndpointBroken)
	}
	ep := &Endpoint{from: t, to: peer, pending: map[*batch]struct{}{}}
	t.endpoints = append(t.endpoints, ep)
	return ep, nil
}

// Close tears down every endpoint and stops the link.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		return nil
	}
	t.closed.Store(true)
	eps := t.endpoints
	t.endpoints = nil
	t.mu.Unlock()
	for _, ep := range eps {
		_ = ep.Close()
	}
	t.inbound.Lock() // wait for other nodes' copies under way
	t.inbound.Unlock()
	t.fab.mu.Lock()
	delete(t.fab.nodes, t.name)
	t.fab.mu.Unlock()
	t.signal()
	<-t.stopped
	return nil
}

func (t *Transport) isClosed() bool { return t.closed.Load() }

func (t *Transport) forget(e *Endpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, x := range t.endpoints {
		if x == e {
			t.endpoints = append(t.endpoints[:i], t.endpoints[i+1:]...)
			return
		}
	}
}

func (t *Transport) signal() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Endpoint writes from one node into another.
type Endpoint struct {
	from, to *Transport

	// landMu is held across every copy into the peer's memory; Close takes
	// it after marking the endpoint closed, which makes Close a barrier. It
	// is separate from mu so that reporting a completion never waits for
	// another batch's copy. Order: landMu, then the peer's inbound, then mu.
	landMu  sync.Mutex
	mu      sync.Mutex // guards the fields below and the batches' report state
	pending map[*batch]struct{}
	closed  bool
	broken  error

	// Read by every Post without a lock: a lock the link goroutine also
	// takes costs a cache-line transfer between cores per batch.
	remotes atomic.Pointer[[]*region] // imported regions; replaced, never changed
	down    atomic.Bool               // closed or broken (set under mu)
}

var _ rdma.Endpoint = (*Endpoint)(nil)

type batch struct {
	ep       *Endpoint
	info     BatchInfo
	fault    Fault
	writes   []rdma.Write
	srcs     [][]byte // per write: source bytes
	dsts     [][]byte // per write: destination bytes
	staged   []byte   // on a modeled link: the sources as read at post time
	done     func(error)
	posted   time.Time
	landAt   time.Time
	applied  bool  // landed or failed already; only the report is left
	err      error // the outcome once applied
	reported bool  // done was called (guarded by ep.mu)
}

// Batch records are reused once land has reported them, so that the steady
// state of a transfer allocates nothing per batch. A record that Close failed
// is left to the collector: Close calls its done after letting go of ep.mu,
// and the link may still pop it from the queue.
var batches = sync.Pool{New: func() any { return new(batch) }}

func newBatch(n int) *batch {
	b := batches.Get().(*batch)
	if cap(b.srcs) < n {
		b.srcs, b.dsts = make([][]byte, n), make([][]byte, n)
	}
	b.srcs, b.dsts = b.srcs[:n], b.dsts[:n]
	return b
}

func recycle(b *batch) {
	clear(b.srcs) // drop references to registered memory
	clear(b.dsts)
	*b = batch{srcs: b.srcs[:0], dsts: b.dsts[:0], writes: b.writes[:0]}
	batches.Put(b)
}

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

// Post validates the writes and starts the batch: on a modeled link it reads
// the sources and queues the batch on the sending node's link; on an unmodeled
// one it lands the bytes at once and queues only the completion.
func (e *Endpoint) Post(ws []rdma.Write, done func(error)) error {
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
	t := e.from
	b.ep, b.done = e, done
	b.writes = append(b.writes, ws...)
	b.info = BatchInfo{From: t.name, To: e.to.name, Seq: t.seq.Add(1), Bytes: total, Writes: len(ws)}
	if len(ws) > 0 {
		b.info.Dst = ws[0].Dst
	}
	if f := t.fab.opts.Faults; f != nil {
		b.fault = f(b.info)
	}
	if b.fault.Kind == PostError {
		err := errors.Mark(errors.Newf("loopback: post of batch %d %s->%s: injected error", b.info.Seq, t.name, e.to.name), ErrInjected)
		recycle(b)
		return err
	}

	opts := t.fab.opts
	var busy time.Duration
	if opts.Bandwidth > 0 {
		busy = time.Duration(float64(total) * opts.ByteScale / opts.Bandwidth * float64(time.Second))
	}
	if b.fault.Kind == SlowLink {
		busy += b.fault.Delay
	}
	t.lmu.Lock()
	// Stamped under the link's lock, so that stamps and busyUntil move
	// together: a stamp taken before another poster's batch moved
	// busyUntil would send this batch the modeled way on an unmodeled
	// link, and a later batch of the same poster could land before it.
	b.posted = time.Now()
	start := b.posted
	if t.busyUntil.After(start) {
		start = t.busyUntil
	}
	t.busyUntil = start.Add(scaled(busy, opts.TimeScale))
	b.landAt = t.busyUntil.Add(scaled(opts.Latency, opts.TimeScale))
	if b.fault.Kind == DelayCompletion { // lands late without holding the link
		b.landAt = b.landAt.Add(scaled(b.fault.Delay, opts.TimeScale))
	}
	t.lmu.Unlock()
	now := !b.landAt.After(b.posted)
	if !now || hasDevice(b.srcs, ws) {
		// A real NIC may read the sources any time after the post: on a
		// modeled link read them now, the strictest test of write-before-
		// read. Device memory is read (DtoH) here in any case.
		b.staged = getStage(total)
		for i, s := range b.srcs {
			if s != nil || ws[i].Len == 0 {
				b.staged = append(b.staged, s...)
				continue
			}
			off := len(b.staged)
			b.staged = b.staged[:off+int(ws[i].Len)]
			if err := opts.ReadDevice(b.staged[off:], ws[i].Src); err != nil {
				putStage(b.staged)
				recycle(b)
				return errors.Mark(errors.Wrapf(err, "loopback: read write %d's source from device memory", i), rdma.ErrInvalidWrite)
			}
		}
	}
	if now {
		e.landMu.Lock()
		e.to.inbound.RLock()
	}
	e.mu.Lock()
	// Checked again under the lock that Close takes: a Close since the
	// first check must not find a batch it did not fail.
	if e.closed || (e.broken != nil && b.fault.Kind != PeerGone) {
		e.mu.Unlock()
		if now {
			e.to.inbound.RUnlock()
			e.landMu.Unlock()
		}
		putStage(b.staged)
		recycle(b)
		return e.refuse()
	}
	if b.fault.Kind == PeerGone && e.broken == nil {
		e.broken = errors.Mark(errors.Newf("loopback: peer %s gone (batch %d)", e.to.name, b.info.Seq), ErrInjected)
		e.down.Store(true)
	}
	e.pending[b] = struct{}{}
	if now {
		b.err = e.fate(b)
	}
	e.mu.Unlock()
	if now {
		// Not yet on the queue, so nothing but Close sees the batch; a
		// Close now waits for landMu, and then the copy is over.
		if b.err == nil {
			e.copyBytes(b)
		}
		b.applied = true
		e.to.inbound.RUnlock()
		e.landMu.Unlock()
	}
	t.lmu.Lock()
	t.insert(b)
	t.lmu.Unlock()
	t.signal()
	return nil
}

// refuse returns why the endpoint takes no more batches, or nil.
func (e *Endpoint) refuse() error {
	if e.to.isClosed() {
		return errors.Mark(errors.Newf("loopback: peer %s is gone", e.to.name), rdma.ErrEndpointBroken)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.broken != nil:
		return errors.Mark(e.broken, rdma.ErrEndpointBroken)
	case e.closed:
		return errors.Mark(errors.Newf("loopback: endpoint %s->%s closed", e.from.name, e.to.name), rdma.ErrEndpointBroken)
	}
	return nil
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
	e.from.mu.Lock()
	defer e.from.mu.Unlock()
	for i, w := range ws {
		if src == nil || src.key != w.Local {
			if src = e.from.regions[w.Local]; src == nil {
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

func scaled(d time.Duration, scale float64) time.Duration {
	return time.Duration(float64(d) / scale)
}

func (r *region) contains(addr, n uint64) bool {
	return addr >= r.addr && n <= r.len && addr-r.addr <= r.len-n
}

func (r *region) slice(addr, n uint64) []byte {
	if r.mem == nil {
		return nil // device memory: read at post
	}
	off := addr - r.addr
	return r.mem[off : off+n]
}

// insert keeps the queue ordered by landing time (stable for equal times).
func (t *Transport) insert(b *batch) {
	i := len(t.queue)
	for i > 0 && t.queue[i-1].landAt.After(b.landAt) {
		i--
	}
	t.queue = append(t.queue, nil)
	copy(t.queue[i+1:], t.queue[i:])
	t.queue[i] = b
}

// link lands batches at their modeled times.
func (t *Transport) link() {
	defer close(t.stopped)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []*batch // reused: only this goroutine touches it
	for {
		if t.isClosed() {
			return
		}
		// Take every due batch off the head in one go. The head is read
		// and removed under one lock: a concurrent Post may insert a batch
		// with an earlier landing time in front of it.
		t.lmu.Lock()
		now := time.Now()
		for len(t.queue) > 0 && !t.queue[0].landAt.After(now) {
			due = append(due, t.queue[0])
			t.queue[0] = nil // the record may be reused once landed
			t.queue = t.queue[1:]
		}
		var next time.Time
		if len(due) == 0 && len(t.queue) > 0 {
			next = t.queue[0].landAt
		}
		t.lmu.Unlock()
		if len(due) > 0 {
			for i, b := range due {
				b.ep.land(b)
				due[i] = nil
			}
			due = due[:0]
			continue
		}
		if next.IsZero() {
			<-t.wake
			continue
		}
		d := next.Sub(now)
		if t.fab.opts.Precise && d <= clock.Slack {
			clock.SleepUntil(next, true)
			continue
		}
		if t.fab.opts.Precise {
			d -= clock.Slack // wake early, then land on time
		}
		timer.Reset(d)
		select {
		case <-timer.C:
		case <-t.wake:
			timer.Stop() // Go 1.23+: no stale value survives Stop
		}
	}
}

// land writes a batch's bytes, unless Post did, and reports it, unless the
// endpoint was torn down first.
func (e *Endpoint) land(b *batch) {
	if !b.applied {
		e.landMu.Lock()
		e.to.inbound.RLock()
		e.mu.Lock()
		if !b.reported {
			b.err = e.fate(b)
		}
		skip := b.reported || b.err != nil
		e.mu.Unlock()
		if !skip {
			e.copyBytes(b)
		}
		b.applied = true
		e.to.inbound.RUnlock()
		e.landMu.Unlock()
	}
	e.mu.Lock()
	if b.reported || b.fault.Kind == LoseCompletion {
		// Close failed it, or it landed and its report is lost until
		// teardown.
		e.mu.Unlock()
		return
	}
	b.reported = true
	delete(e.pending, b)
	e.mu.Unlock()
	putStage(b.staged)
	b.staged = nil
	b.done(b.err)
	recycle(b)
}

// fate decides whether a batch's bytes may land: nil, or why it fails. The
// caller holds e.mu.
func (e *Endpoint) fate(b *batch) error {
	switch {
	case e.to.isClosed():
		return errors.Mark(errors.Newf("loopback: batch %d %s->%s: the peer is gone", b.info.Seq, b.info.From, b.info.To), rdma.ErrEndpointBroken)
	case b.fault.Kind == FailCompletion:
		return errors.Mark(errors.Newf("loopback: batch %d %s->%s: injected completion error", b.info.Seq, b.info.From, b.info.To), ErrInjected)
	case b.fault.Kind == PeerGone:
		return errors.Mark(e.broken, rdma.ErrEndpointBroken)
	}
	return nil
}

// copyBytes lands a batch's bytes. The caller holds e.landMu.
func (e *Endpoint) copyBytes(b *batch) {
	opts := e.from.fab.opts
	off := 0
	for i, dst := range b.dsts {
		if b.staged != nil {
			copy(dst, b.staged[off:off+len(dst)])
			off += len(dst)
		} else {
			copy(dst, b.srcs[i])
		}
		if opts.OnLand != nil {
			opts.OnLand(Landing{Node: e.to.name, Addr: b.writes[i].Dst, Len: b.writes[i].Len, Posted: b.posted, At: time.Now()})
		}
	}
	if opts.OnBatch != nil {
		opts.OnBatch(BatchSpan{From: b.info.From, To: b.info.To, Seq: b.info.Seq, Bytes: b.info.Bytes, Posted: b.posted, Landed: time.Now()})
	}
}

// Staging buffers are reused: fresh memory costs a page fault per page on
// first touch, which dwarfs the copy itself (hundreds of ms per GB in a VM).
// A plain free list, not a sync.Pool: a pool is emptied by the collector,
// and the scavenger would hand the pages back to the OS.
var stages struct {
	sync.Mutex
	free [40][][]byte // by power-of-two capacity
}

const stagesPerClass = 8

// Prewarm makes count staging buffers for batches of up to n bytes ready,
// their pages touched, so that the first batches of a benchmark do not pay
// the first-touch faults (on a VM, up to a few hundred ms per 32 MB).
func Prewarm(n uint64, count int) {
	bufs := make([][]byte, 0, count)
	for i := 0; i < count; i++ {
		b := getStage(n)
		b = b[:cap(b)]
		for j := 0; j < len(b); j += 4096 {
			b[j] = 0
		}
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		putStage(b)
	}
}

func getStage(n uint64) []byte {
	c := 0
	if n > 1 {
		c = bits.Len64(n - 1)
	}
	stages.Lock()
	defer stages.Unlock()
	if l := len(stages.free[c]); l > 0 {
		b := stages.free[c][l-1]
		stages.free[c] = stages.free[c][:l-1]
		return b[:0]
	}
	return make([]byte, 0, 1<<c)
}

func putStage(b []byte) {
	if cap(b) == 0 || cap(b)&(cap(b)-1) != 0 {
		return
	}
	c := bits.Len64(uint64(cap(b)) - 1)
	stages.Lock()
	defer stages.Unlock()
	if len(stages.free[c]) < stagesPerClass {
		stages.free[c] = append(stages.free[c], b[:0])
	}
}

// Close fails every batch that has not landed; after it returns nothing of
// this endpoint lands.
func (e *Endpoint) Close() error {
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
	e.from.forget(e)
	for _, b := range failed {
		b.done(errors.Mark(errors.Newf("loopback: batch %d %s->%s: endpoint torn down", b.info.Seq, b.info.From, b.info.To), rdma.ErrEndpointBroken))
	}
	return nil
}

var (
	defaultOnce   sync.Once
	defaultFabric *Fabric
)

// Default returns the process's shared fabric with no modeled link: the
// embedded default through which an engine and an in-process decode pool
// reach each other.
func Default() *Fabric {
	defaultOnce.Do(func() { defaultFabric = NewFabric(Options{}) })
	return defaultFabric
}
