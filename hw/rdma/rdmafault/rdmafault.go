package rdmafault

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// BatchInfo identifies a batch for a fault decision.
type BatchInfo struct {
	// From is the sending transport's Address, To the address its endpoint
	// connected to (node names on the loopback; opaque bytes on UCX).
	From, To string
	Seq      uint64 // per wrapped transport, from 1
	Bytes    uint64
	Writes   int
	Dst      uint64 // the first write's destination address (0 if none)
	// DstOffset is the first write's destination offset within the region
	// it writes (as imported on this endpoint), and DstRegion that
	// region's index among the endpoint's imports: unlike Dst, the same
	// from run to run wherever the peer's memory is mapped.
	DstOffset uint64
	DstRegion int
}

// Fault is how a batch misbehaves.
type Fault struct {
	Kind  Kind
	Delay time.Duration // DelayCompletion: how much later done runs (wall time)
}

// Kind enumerates the injectable faults.
type Kind int

const (
	// None: the batch goes to the transport untouched.
	None Kind = iota
	// PostError: Post fails; nothing starts.
	PostError
	// LoseCompletion: the bytes land but done runs only when the endpoint
	// is torn down, with its error.
	LoseCompletion
	// DelayCompletion: the bytes land; done runs Delay after the transport
	// completed the batch.
	DelayCompletion
	// FailCompletion: nothing lands and done reports an error.
	FailCompletion
	// PeerGone: the batch fails as if the peer vanished, and the endpoint is
	// broken for every later batch (earlier ones still complete).
	PeerGone
	// BreakEndpoint: the connection breaks in the middle of the batch (a
	// TCP reset, a queue pair in error): its first half of writes reaches
	// the transport and lands, the rest never does, done reports an error
	// marked rdma.ErrEndpointBroken once that half completed, and the
	// endpoint refuses every later batch. The peer is still there: a fresh
	// endpoint works.
	BreakEndpoint
)

// String names a fault kind.
func (k Kind) String() string {
	names := [...]string{"none", "post_error", "lose_completion", "delay_completion", "fail_completion", "peer_gone", "endpoint_broken"}
	if k < 0 || int(k) >= len(names) {
		return "unknown"
	}
	return names[k]
}

// ErrInjected marks failures produced by fault injection.
var ErrInjected = errors.New("rdmafault: injected fault")

// Transport is a transport whose endpoints inject faults.
type Transport struct {
	inner  rdma.Transport
	decide func(BatchInfo) Fault
	from   string
	seq    atomic.Uint64

	mu     sync.Mutex
	eps    map[*Endpoint]struct{}
	closed bool
}

var (
	_ rdma.Transport      = (*Transport)(nil)
	_ rdma.PeerAccessor   = (*Transport)(nil)
	_ rdma.Allocator      = (*Transport)(nil)
	_ rdma.TypedRegistrar = (*Transport)(nil)
)

// Wrap returns inner with faults decided by decide, which runs inside Post
// on the poster's goroutine, once per batch that reaches it.
func Wrap(inner rdma.Transport, decide func(BatchInfo) Fault) *Transport {
	return &Transport{inner: inner, decide: decide, from: string(inner.Address()), eps: map[*Endpoint]struct{}{}}
}

// Unwrap returns the wrapped transport.
func (t *Transport) Unwrap() rdma.Transport { return t.inner }

// Name returns the wrapped transport's name.
func (t *Transport) Name() string { return t.inner.Name() }

// Address returns the wrapped transport's address.
func (t *Transport) Address() []byte { return t.inner.Address() }

// Register registers memory with the wrapped transport.
func (t *Transport) Register(addr, length uint64) (rdma.Region, error) {
	return t.inner.Register(addr, length)
}

// RegisterTyped registers memory of a type with the wrapped transport
// (rdma.RegisterMemory: its Register when it takes no type).
func (t *Transport) RegisterTyped(addr, length uint64, mt rdma.MemoryType) (rdma.Region, error) {
	return rdma.RegisterMemory(t.inner, addr, length, mt)
}

// Allocate allocates memory with the wrapped transport, or answers
// rdma.ErrUnsupported when that transport does not allocate.
func (t *Transport) Allocate(length uint64) (rdma.Allocation, error) {
	al, ok := t.inner.(rdma.Allocator)
	if !ok {
		return nil, errors.Mark(errors.Newf("rdmafault: the wrapped %s transport does not allocate memory", t.inner.Name()), rdma.ErrUnsupported)
	}
	return al.Allocate(length)
}

// OpenPeerAccess opens an access point of the wrapped transport (faults are
// injected at the sender, so it is the wrapped one's as it is), or answers
// rdma.ErrUnsupported when that transport offers none.
func (t *Transport) OpenPeerAccess() (rdma.PeerAccess, error) {
	pa, ok := t.inner.(rdma.PeerAccessor)
	if !ok {
		return nil, errors.Mark(errors.Newf("rdmafault: the wrapped %s transport offers no per-peer access points", t.inner.Name()), rdma.ErrUnsupported)
	}
	return pa.OpenPeerAccess()
}

// Connect opens an endpoint of the wrapped transport and wraps it.
func (t *Transport) Connect(addr []byte) (rdma.Endpoint, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, errors.Mark(errors.New("rdmafault: transport closed"), rdma.ErrEndpointBroken)
	}
	inner, err := t.inner.Connect(addr)
	if err != nil {
		return nil, err
	}
	e := &Endpoint{t: t, inner: inner, to: string(addr), held: map[*call]struct{}{}}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = inner.Close()
		return nil, errors.Mark(errors.New("rdmafault: transport closed"), rdma.ErrEndpointBroken)
	}
	t.eps[e] = struct{}{}
	t.mu.Unlock()
	return e, nil
}

// Close closes every endpoint, failing the batches the wrapper holds, then
// the wrapped transport.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return t.inner.Close()
	}
	t.closed = true
	eps := make([]*Endpoint, 0, len(t.eps))
	for e := range t.eps {
		eps = append(eps, e)
	}
	t.mu.Unlock()
	var errs error
	for _, e := range eps {
		errs = errors.CombineErrors(errs, e.Close())
	}
	return errors.CombineErrors(errs, t.inner.Close())
}

func (t *Transport) forget(e *Endpoint) {
	t.mu.Lock()
	delete(t.eps, e)
	t.mu.Unlock()
}

// Endpoint is an endpoint whose batches may misbehave.
type Endpoint struct {
	t     *Transport
	inner rdma.Endpoint
	to    string

	mu     sync.Mutex
	held   map[*call]struct{} // batches with a fault whose done has not run
	closed bool
	broken error // set by PeerGone
	// imports: per RemoteKey the inner endpoint gave out, the region's
	// address and its index among this endpoint's imports.
	imports map[rdma.RemoteKey]imported
}

type imported struct {
	addr  uint64
	index int
}

var _ rdma.Endpoint = (*Endpoint)(nil)

// call is a faulty batch: the wrapper, not the transport, runs its done.
type call struct {
	info      BatchInfo
	fault     Fault
	done      func(error)
	innerDone bool  // the transport reported the batch
	innerErr  error // and with this outcome
	timer     *time.Timer
	reported  bool // done ran or is about to (guarded by the endpoint's mu)
}

// Import imports a peer's region into the wrapped endpoint.
func (e *Endpoint) Import(d rdma.RegionDesc) (rdma.RemoteKey, error) {
	k, err := e.inner.Import(d)
	if err == nil {
		e.mu.Lock()
		if e.imports == nil {
			e.imports = map[rdma.RemoteKey]imported{}
		}
		e.imports[k] = imported{addr: d.Addr, index: len(e.imports)}
		e.mu.Unlock()
	}
	return k, err
}

// Post asks the decision function about the batch and posts it, fails it or
// holds its completion accordingly.
func (e *Endpoint) Post(ws []rdma.Write, done func(error)) error {
	e.mu.Lock()
	err := e.refuse()
	e.mu.Unlock()
	if err != nil {
		return err
	}
	info := BatchInfo{From: e.t.from, To: e.to, Seq: e.t.seq.Add(1), Writes: len(ws)}
	for _, w := range ws {
		info.Bytes += w.Len
	}
	if len(ws) > 0 {
		info.Dst = ws[0].Dst
		e.mu.Lock()
		if im, ok := e.imports[ws[0].Remote]; ok {
			info.DstOffset, info.DstRegion = ws[0].Dst-im.addr, im.index
		}
		e.mu.Unlock()
	}
	f := e.t.decide(info)
	switch f.Kind {
	case None:
		// The transport's own completion: no allocation, no bookkeeping.
		return e.inner.Post(ws, done)
	case PostError:
		return errors.Mark(errors.Newf("rdmafault: post of batch %d %s->%s: injected error", info.Seq, info.From, info.To), ErrInjected)
	}
	c := &call{info: info, fault: f, done: done}
	e.mu.Lock()
	if err := e.refuse(); err != nil {
		e.mu.Unlock()
		return err
	}
	e.held[c] = struct{}{}
	switch f.Kind {
	case FailCompletion, PeerGone:
		var err error
		if f.Kind == PeerGone {
			e.broken = errors.Mark(errors.Newf("rdmafault: peer %s gone (batch %d)", info.To, info.Seq), ErrInjected)
			err = errors.Mark(e.broken, rdma.ErrEndpointBroken)
		} else {
			err = errors.Mark(errors.Newf("rdmafault: batch %d %s->%s: injected completion error", info.Seq, info.From, info.To), ErrInjected)
		}
		e.mu.Unlock()
		// Nothing reaches the transport; done runs on a goroutine of ours,
		// as the contract wants it outside Post.
		go e.report(c, err)
		return nil
	case BreakEndpoint:
		e.broken = errors.Mark(errors.Newf("rdmafault: endpoint to %s broke in batch %d", info.To, info.Seq), ErrInjected)
		broken := errors.Mark(e.broken, rdma.ErrEndpointBroken)
		e.mu.Unlock()
		half := ws[:len(ws)/2]
		if len(half) == 0 {
			go e.report(c, broken)
			return nil
		}
		// The half that lands goes through the transport; whatever it
		// reports, the batch failed, and what the transport says may
		// still land of that half (ErrNotQuiesced, and ErrFenced) the
		// batch says too, so that it is not resumed as if quiet.
		if err := e.inner.Post(half, func(err error) { e.report(c, withQuiescence(broken, err)) }); err != nil {
			go e.report(c, withQuiescence(broken, err))
		}
		return nil
	}
	e.mu.Unlock()
	if err := e.inner.Post(ws, func(err error) { e.innerDone(c, err) }); err != nil {
		e.mu.Lock()
		delete(e.held, c)
		e.mu.Unlock()
		return err
	}
	return nil
}

// withQuiescence adds to broken the inner transport's word that writes of
// the batch may still land (rdma.ErrNotQuiesced, with rdma.ErrFenced where
// it said that too), with inner as its detail.
func withQuiescence(broken, inner error) error {
	if !errors.Is(inner, rdma.ErrNotQuiesced) {
		return broken
	}
	err := errors.WithSecondaryError(errors.Mark(broken, rdma.ErrNotQuiesced), inner)
	if errors.Is(inner, rdma.ErrFenced) {
		err = errors.Mark(err, rdma.ErrFenced)
	}
	return err
}

// refuse says why the endpoint takes no more batches. The caller holds e.mu.
func (e *Endpoint) refuse() error {
	switch {
	case e.closed:
		return errors.Mark(errors.Newf("rdmafault: endpoint to %s closed", e.to), rdma.ErrEndpointBroken)
	case e.broken != nil:
		return errors.Mark(e.broken, rdma.ErrEndpointBroken)
	}
	return nil
}

// innerDone is the transport's completion of a held batch.
func (e *Endpoint) innerDone(c *call, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c.innerDone, c.innerErr = true, err
	if c.reported || c.fault.Kind == LoseCompletion {
		return // Close reports it
	}
	// DelayCompletion. Armed under the lock that Close takes, so that Close
	// either stops the timer or finds the batch not yet armed.
	c.timer = time.AfterFunc(c.fault.Delay, func() { e.report(c, err) })
}

// report runs a held batch's done once.
func (e *Endpoint) report(c *call, err error) {
	e.mu.Lock()
	if c.reported {
		e.mu.Unlock()
		return
	}
	c.reported = true
	delete(e.held, c)
	e.mu.Unlock()
	c.done(err)
}

// Close closes the wrapped endpoint, then fails every batch the wrapper
// still holds: lost or delayed completions and injected failures not yet
// reported.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	closeErr := e.inner.Close()
	e.t.forget(e)
	e.mu.Lock()
	var failed []*call
	for c := range e.held {
		if !c.reported {
			c.reported = true
			if c.timer != nil {
				c.timer.Stop()
			}
			failed = append(failed, c)
		}
	}
	clear(e.held)
	e.mu.Unlock()
	for _, c := range failed {
		err := errors.Mark(errors.Newf("rdmafault: batch %d %s->%s: endpoint torn down", c.info.Seq, c.info.From, c.info.To), rdma.ErrEndpointBroken)
		switch {
		case c.innerDone && c.innerErr != nil:
			err = c.innerErr
		case !c.innerDone && c.fault.Kind != FailCompletion && c.fault.Kind != PeerGone && errors.Is(closeErr, rdma.ErrNotQuiesced):
			// The transport could not say that this batch's writes stopped.
			err = errors.Mark(err, rdma.ErrNotQuiesced)
		}
		c.done(err)
	}
	return closeErr
}
