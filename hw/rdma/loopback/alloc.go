package loopback

import (
	"math"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
)

// allocation is a hostmem block the transport allocated and registered.
type allocation struct {
	*region
	blk  *hostmem.Block
	once sync.Once
	err  error
}

var (
	_ rdma.Allocator  = (*Transport)(nil)
	_ rdma.Allocation = (*allocation)(nil)
)

// Allocate maps length zeroed bytes with hostmem and registers them. In
// one process every registered byte is reached by a memcpy anyway; the
// loopback offers Allocate so that the code paths that prefer allocated
// pools run over it too.
func (t *Transport) Allocate(length uint64) (rdma.Allocation, error) {
	if length == 0 {
		return nil, errors.Mark(errors.Newf("loopback: allocate on %s: zero length", t.name), rdma.ErrInvalidWrite)
	}
	if length > math.MaxInt {
		return nil, errors.Mark(errors.Newf("loopback: allocate %d bytes on %s: too large", length, t.name), rdma.ErrInvalidWrite)
	}
	blk, err := hostmem.Alloc(int(length))
	if err != nil {
		return nil, errors.Wrapf(err, "loopback: allocate %d bytes on %s", length, t.name)
	}
	r, err := t.Register(blk.Addr, length)
	if err != nil {
		return nil, errors.CombineErrors(err, blk.Free())
	}
	a := &allocation{region: r.(*region), blk: blk}
	t.mu.Lock()
	if t.closed.Load() { // closed since Register: Close did not see it
		t.mu.Unlock()
		return nil, errors.CombineErrors(errors.Mark(errors.Newf("loopback: node %s closed", t.name), rdma.ErrEndpointBroken), a.Free())
	}
	t.allocs[a] = struct{}{}
	t.mu.Unlock()
	return a, nil
}

// Bytes is the allocated memory.
func (a *allocation) Bytes() []byte { return a.blk.Bytes }

// Deregister is Free: the transport owns the memory.
func (a *allocation) Deregister() error { return a.Free() }

// Free deregisters the region, waits for copies into the node under way,
// and unmaps the memory. rdma.Allocation.Free says when a peer's access
// allows it: a batch already posted by a peer that was not cut off would
// copy into the unmapped memory.
func (a *allocation) Free() error {
	a.once.Do(func() {
		t := a.t
		_ = a.region.Deregister()
		t.mu.Lock()
		delete(t.allocs, a)
		t.mu.Unlock()
		t.inbound.Lock() // a copy under way into the node may be into this block
		t.inbound.Unlock()
		a.err = a.blk.Free()
	})
	return a.err
}
