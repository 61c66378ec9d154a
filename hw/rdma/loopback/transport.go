package loopback

import (
	"encoding/binary"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/internal/clock"
	"github.com/kvstream/kvstream/hw/rdma"
)

// Transport is one node of the fabric.
type Transport struct {
	fab  *Fabric
	name string

	mu         sync.Mutex // guards nextKey, endpoints, accesses and the writers of regions and closed
	nextKey    rdma.LocalKey
	endpoints  []*Endpoint
	accesses   map[*access]struct{}     // open peer access points
	allocs     map[*allocation]struct{} // memory Allocate mapped and Free did not release
	nextAccess int
	// regions is replaced, never changed, under mu: Post reads it without
	// a lock (registration is rare, posts are not).
	regions atomic.Pointer[map[rdma.LocalKey]*region]
	// closed is written under mu (so that no region or endpoint is added
	// after Close) and read without it: landing checks the peer while
	// holding an endpoint's lock, and a node may connect to itself.
	closed atomic.Bool

	// inbound is held for reading across every copy into this node's
	// memory, and taken for writing by Close once closed is set: after
	// Close returns no other node's write lands here.
	inbound sync.RWMutex

	out link // the sending side: batches in landing order
}

var _ rdma.Transport = (*Transport)(nil)

func newTransport(f *Fabric, name string) *Transport {
	t := &Transport{fab: f, name: name, accesses: map[*access]struct{}{}, allocs: map[*allocation]struct{}{}}
	t.regions.Store(&map[rdma.LocalKey]*region{})
	t.out.init(&f.opts)
	return t
}

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
	rs := maps.Clone(*t.regions.Load())
	rs[r.key] = r
	t.regions.Store(&rs)
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
	defer r.t.mu.Unlock()
	rs := maps.Clone(*r.t.regions.Load())
	delete(rs, r.key)
	r.t.regions.Store(&rs)
	return nil
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

func (t *Transport) region(k rdma.LocalKey) *region {
	return (*t.regions.Load())[k]
}

// Connect opens an endpoint to the node named addr, or to the node whose
// peer access point addr is.
func (t *Transport) Connect(addr []byte) (rdma.Endpoint, error) {
	peer, via := t.fab.resolve(string(addr))
	if peer == nil {
		return nil, errors.Mark(errors.Newf("loopback: no node or access point %q", addr), rdma.ErrEndpointBroken)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil, errors.Mark(errors.Newf("loopback: node %s closed", t.name), rdma.ErrEndpointBroken)
	}
	ep := &Endpoint{from: t, to: peer, via: via, pending: map[*batch]struct{}{}}
	if via != nil {
		// Under t.mu, so that this node's Close finds the endpoint; the
		// access point's Revoke closes it, or refuses it here.
		if err := via.join(ep); err != nil {
			return nil, err
		}
	}
	t.endpoints = append(t.endpoints, ep)
	return ep, nil
}

// Close tears down every endpoint and access point, waits for other nodes'
// copies into this node's memory, stops the link, and releases the memory
// Allocate mapped.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		return nil
	}
	t.closed.Store(true)
	eps := t.endpoints
	t.endpoints = nil
	accesses := make([]*access, 0, len(t.accesses))
	for a := range t.accesses {
		accesses = append(accesses, a)
	}
	t.mu.Unlock()
	for _, a := range accesses {
		_ = a.Revoke()
	}
	for _, ep := range eps {
		_ = ep.Close()
	}
	t.inbound.Lock() // wait for other nodes' copies under way
	t.inbound.Unlock()
	t.fab.forget(t.name)
	t.out.stop()
	t.mu.Lock()
	allocs := make([]*allocation, 0, len(t.allocs))
	for a := range t.allocs {
		allocs = append(allocs, a)
	}
	t.mu.Unlock()
	var err error
	for _, a := range allocs { // nothing lands here any more
		err = errors.CombineErrors(err, a.Free())
	}
	return err
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

// scaled is d of modeled time as wall time; beyond time.Duration's range
// it is held at the range's end (see Options.LinkTime).
func scaled(d time.Duration, scale float64) time.Duration {
	w, _ := clock.Duration(float64(d) / scale)
	return w
}
