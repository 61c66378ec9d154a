package loopback

import (
	"fmt"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// access is one peer's access point: a name on the fabric, besides the
// node's own, that resolves to the node's regions. Endpoints connected
// through it are the access point's to cut off.
type access struct {
	t    *Transport
	name string

	mu      sync.Mutex
	eps     map[*Endpoint]struct{}
	revoked bool
	done    chan struct{} // closed once the first Revoke has cut everything
}

var (
	_ rdma.PeerAccessor = (*Transport)(nil)
	_ rdma.PeerAccess   = (*access)(nil)
)

// OpenPeerAccess adds a name to the fabric that Connects like the node's
// own, and that Revoke removes again, closing every endpoint connected
// through it.
func (t *Transport) OpenPeerAccess() (rdma.PeerAccess, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil, errors.Mark(errors.Newf("loopback: node %s closed", t.name), rdma.ErrEndpointBroken)
	}
	a := &access{t: t, eps: map[*Endpoint]struct{}{}, done: make(chan struct{})}
	for {
		t.nextAccess++
		a.name = fmt.Sprintf("%s/access-%d", t.name, t.nextAccess)
		if t.fab.addAccess(a) {
			break
		}
	}
	t.accesses[a] = struct{}{}
	return a, nil
}

// Address is the access point's name on the fabric.
func (a *access) Address() []byte { return []byte(a.name) }

// Revoke removes the name from the fabric, so that no new endpoint reaches
// the node through it, and closes every endpoint connected through it:
// Endpoint.Close fails their unreported batches and waits for a copy under
// way, so when Revoke returns nothing posted through the access point lands
// and later posts fail with rdma.ErrEndpointBroken. The loopback copies
// every byte itself, so it always quiesces.
func (a *access) Revoke() error {
	a.mu.Lock()
	if a.revoked {
		a.mu.Unlock()
		<-a.done // a concurrent first Revoke: return once it has cut everything
		return nil
	}
	a.revoked = true
	eps := make([]*Endpoint, 0, len(a.eps))
	for e := range a.eps {
		eps = append(eps, e)
	}
	clear(a.eps)
	a.mu.Unlock()
	a.t.fab.forget(a.name)
	for _, e := range eps {
		_ = e.closeWith("the peer's access point was revoked", true)
	}
	a.t.mu.Lock()
	delete(a.t.accesses, a)
	a.t.mu.Unlock()
	close(a.done)
	return nil
}

// join records an endpoint connected through the access point, or refuses
// it once revoked.
func (a *access) join(e *Endpoint) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.revoked {
		return errors.Mark(errors.Mark(errors.Newf("loopback: access point %s revoked", a.name), rdma.ErrEndpointBroken), rdma.ErrRevoked)
	}
	a.eps[e] = struct{}{}
	return nil
}

func (a *access) leave(e *Endpoint) {
	a.mu.Lock()
	delete(a.eps, e)
	a.mu.Unlock()
}
