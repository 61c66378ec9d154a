package rdmatest

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The PeerAccessor checks run when the target side of Factory.Pair offers
// per-peer access points (rdma.PeerAccessor, an OpenPeerAccess that does not
// answer rdma.ErrUnsupported).

// chunk is each endpoint's share of the destination: endpoint k writes
// [k*chunk, (k+1)*chunk), so that one peer's bytes are told from another's.
const chunk = 64 << 10

// accessRig is a sender and a target side with one source and one
// destination region, registered before any access point is opened.
type accessRig struct {
	f        Factory
	from, to rdma.Transport
	pa       rdma.PeerAccessor
	src, dst side
}

func newAccessRig(t *testing.T, f Factory, chunks int) *accessRig {
	t.Helper()
	from, to := f.Pair(t)
	t.Cleanup(func() { _ = from.Close(); _ = to.Close() })
	pa, ok := to.(rdma.PeerAccessor)
	if !ok {
		t.Skipf("%s offers no per-peer access points", to.Name())
	}
	r := &accessRig{f: f, from: from, to: to, pa: pa}
	r.src, r.dst = newSide(t, f.pool, from, chunks*chunk), newSide(t, f.pool, to, chunks*chunk)
	for i := range r.src.mem.Bytes {
		r.src.mem.Bytes[i] = byte(i*13+5) | 1 // never zero: a landed byte shows
	}
	return r
}

// open opens an access point and revokes it at cleanup (checking the
// answer then too: a Revoke after others must still mean the same).
func (r *accessRig) open(t *testing.T) rdma.PeerAccess {
	t.Helper()
	a, err := r.pa.OpenPeerAccess()
	if errors.Is(err, rdma.ErrUnsupported) {
		t.Skipf("%s: %v", r.to.Name(), err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { r.checkRevoke(t, a.Revoke(), "cleanup") })
	return a
}

// checkRevoke asserts Revoke's answer: nil where the transport cuts every
// write itself, an error marked rdma.ErrNotQuiesced where the peer writes
// the memory directly.
func (r *accessRig) checkRevoke(t *testing.T, err error, what string) {
	t.Helper()
	if r.f.DirectPeerWrites {
		require.Error(t, err, "%s: Revoke cannot confirm that a peer writing directly stopped", what)
		assert.True(t, errors.Is(err, rdma.ErrNotQuiesced), "%s: %v", what, err)
		return
	}
	require.NoError(t, err, what)
}

// peer is one endpoint of the sender, connected to addr, writing chunk k
// of the rig's destination.
type peer struct {
	r  *accessRig
	ep rdma.Endpoint
	rk rdma.RemoteKey
	k  int
}

func (r *accessRig) connect(t *testing.T, addr []byte, k int) *peer {
	t.Helper()
	ep, err := r.from.Connect(addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ep.Close() })
	rk, err := ep.Import(r.dst.reg.Desc())
	require.NoError(t, err)
	return &peer{r: r, ep: ep, rk: rk, k: k}
}

func (p *peer) write() rdma.Write {
	off := uint64(p.k * chunk)
	return rdma.Write{Src: p.r.src.mem.Addr + off, Dst: p.r.dst.mem.Addr + off, Len: chunk, Local: p.r.src.reg.Key(), Remote: p.rk}
}

// mine is the peer's chunk of the destination.
func (p *peer) mine() []byte { return p.r.dst.mem.Bytes[p.k*chunk : (p.k+1)*chunk] }

// land posts one batch into the peer's chunk, waits for it and checks the
// bytes.
func (p *peer) land(t *testing.T, what string) {
	t.Helper()
	clear(p.mine())
	done := make(chan error, 1)
	require.NoError(t, p.ep.Post([]rdma.Write{p.write()}, func(err error) { done <- err }), what)
	require.NoError(t, wait(t, done), what)
	assert.True(t, bytes.Equal(p.r.src.mem.Bytes[p.k*chunk:(p.k+1)*chunk], p.mine()), "%s: the bytes landed", what)
}

// refused posts until the endpoint says it is broken: every post after a
// Revoke must fail, at Post or in done, marked rdma.ErrEndpointBroken.
func (p *peer) refused(t *testing.T, what string) {
	t.Helper()
	for i := range 3 {
		done := make(chan error, 1)
		err := p.ep.Post([]rdma.Write{p.write()}, func(err error) { done <- err })
		if err == nil {
			err = wait(t, done)
		}
		require.Error(t, err, "%s: post %d after Revoke succeeded", what, i)
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%s: %v", what, err)
	}
}

// stillZero checks that nothing lands in the peer's chunk for a while: an
// observation window, not a synchronisation (a slow machine can only hide
// a late write, never invent one).
func (p *peer) stillZero(t *testing.T, what string) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, make([]byte, chunk), p.mine(), "%s: bytes landed after Revoke returned", what)
}

func accessPointsLand(t *testing.T, f Factory) {
	r := newAccessRig(t, f, 4)
	a1, a2 := r.open(t), r.open(t)
	assert.NotEqual(t, a1.Address(), a2.Address(), "each access point has its own address")
	assert.NotEqual(t, r.to.Address(), a1.Address(), "an access point is not the transport's address")

	// A region registered after the access point opened is reachable
	// through it too.
	late := newSide(t, r.f.pool, r.to, chunk)
	p1, p2, p0 := r.connect(t, a1.Address(), 1), r.connect(t, a2.Address(), 2), r.connect(t, r.to.Address(), 0)
	p1.land(t, "through the first access point")
	p2.land(t, "through the second access point")
	p0.land(t, "through the transport's address")

	lk, err := p1.ep.Import(late.reg.Desc())
	require.NoError(t, err)
	done := make(chan error, 1)
	require.NoError(t, p1.ep.Post([]rdma.Write{{Src: r.src.mem.Addr, Dst: late.mem.Addr, Len: chunk, Local: r.src.reg.Key(), Remote: lk}}, func(err error) { done <- err }))
	require.NoError(t, wait(t, done))
	assert.True(t, bytes.Equal(r.src.mem.Bytes[:chunk], late.mem.Bytes), "a region registered later")
}

func revokeCutsThePeer(t *testing.T, f Factory) {
	r := newAccessRig(t, f, 4)
	a1, a2 := r.open(t), r.open(t)
	p1, p2, p0 := r.connect(t, a1.Address(), 1), r.connect(t, a2.Address(), 2), r.connect(t, r.to.Address(), 0)
	p1.land(t, "before Revoke")

	r.checkRevoke(t, a1.Revoke(), "Revoke")
	r.checkRevoke(t, a1.Revoke(), "a second Revoke returns the first one's answer")
	if !f.DirectPeerWrites {
		clear(p1.mine())
		p1.refused(t, "the revoked peer")
		p1.stillZero(t, "the revoked peer")

		// A new connection through the revoked address fails, at Connect,
		// at Import or at its first batch (transports that connect lazily).
		ep, err := r.from.Connect(a1.Address())
		if err == nil {
			var rk rdma.RemoteKey
			if rk, err = ep.Import(r.dst.reg.Desc()); err == nil {
				p := &peer{r: r, ep: ep, rk: rk, k: 3}
				done := make(chan error, 1)
				if err = ep.Post([]rdma.Write{p.write()}, func(err error) { done <- err }); err == nil {
					err = wait(t, done)
				}
			}
			_ = ep.Close()
		}
		require.Error(t, err, "connecting through a revoked access point")
		assert.Equal(t, make([]byte, chunk), r.dst.mem.Bytes[3*chunk:], "nothing landed through the revoked address")
	}
	p2.land(t, "another access point after the Revoke")
	p0.land(t, "the transport's address after the Revoke")
}

// revokeLostCutsThePeer: an access point that offers RevokeLost (a peer
// that stopped answering is cut off without tearing its connections down)
// lands nothing more after it either; the peer's later batches may hang
// rather than fail (nobody answers them), so only the bytes are checked.
func revokeLostCutsThePeer(t *testing.T, f Factory) {
	r := newAccessRig(t, f, 4)
	a1, a2 := r.open(t), r.open(t)
	lr, ok := a1.(rdma.LostPeerRevoker)
	if !ok {
		t.Skipf("%s's access points offer no RevokeLost", r.to.Name())
	}
	p1, p2 := r.connect(t, a1.Address(), 1), r.connect(t, a2.Address(), 2)
	p1.land(t, "before RevokeLost")
	r.checkRevoke(t, lr.RevokeLost(), "RevokeLost")
	r.checkRevoke(t, a1.Revoke(), "a Revoke after RevokeLost returns its answer")
	if !f.DirectPeerWrites {
		clear(p1.mine())
		if err := p1.ep.Post([]rdma.Write{p1.write()}, func(error) {}); err == nil {
			p1.stillZero(t, "the peer cut off by RevokeLost")
		}
	}
	p2.land(t, "another access point after RevokeLost")
}

// revokeInFlight revokes an access point while its peer keeps a window of
// batches in flight: Revoke returns in bounded time, every batch reports
// once, nothing posted after it succeeds and nothing lands after it.
func revokeInFlight(t *testing.T, f Factory) {
	const window = 8
	r := newAccessRig(t, f, 2)
	a := r.open(t)
	p := r.connect(t, a.Address(), 1)

	var (
		revoked  atomic.Bool
		reported sync.Map // batch -> *atomic.Int32
		posted   atomic.Int64
		okAfter  atomic.Int64 // successes of batches posted after Revoke returned
		slots    = make(chan struct{}, window)
		stop     = make(chan struct{})
		stopped  = make(chan struct{})
		ok       = make(chan struct{}, 4*window)
	)
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case slots <- struct{}{}:
			case <-stop:
				return
			}
			after := revoked.Load()
			n := new(atomic.Int32)
			reported.Store(i, n)
			err := p.ep.Post([]rdma.Write{p.write()}, func(err error) {
				n.Add(1)
				if err == nil {
					if after {
						okAfter.Add(1)
					}
					select { // never block the transport's goroutine
					case ok <- struct{}{}:
					default:
					}
				} else {
					assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "batch %d: %v", i, err)
				}
				<-slots
			})
			if err != nil {
				reported.Delete(i)
				<-slots
				assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "post %d: %v", i, err)
				return
			}
			posted.Add(1)
		}
	}()
	for range 2 * window { // batches flow before the Revoke
		select {
		case <-ok:
		case <-time.After(10 * time.Second):
			t.Fatal("batches do not complete")
		}
	}
	res := make(chan error, 1)
	go func() { res <- a.Revoke() }()
	select {
	case err := <-res:
		revoked.Store(true)
		r.checkRevoke(t, err, "Revoke under load")
	case <-time.After(time.Minute):
		t.Fatal("Revoke with batches in flight did not return")
	}
	if !f.DirectPeerWrites {
		clear(p.mine())
		select {
		case <-stopped: // the peer's posts failed
		case <-time.After(time.Minute):
			t.Fatal("the peer's posts kept succeeding after Revoke")
		}
		p.stillZero(t, "with batches in flight")
	}
	close(stop)
	<-stopped
	// The sender's own Close reports whatever is still in flight (a peer
	// that writes directly may not have noticed anything).
	_ = p.ep.Close()
	require.Eventually(t, func() bool {
		all := true
		reported.Range(func(_, n any) bool { all = n.(*atomic.Int32).Load() > 0; return all })
		return all
	}, time.Minute, time.Millisecond, "a batch never reported")
	reported.Range(func(k, n any) bool {
		assert.Equal(t, int32(1), n.(*atomic.Int32).Load(), "batch %v reported more than once", k)
		return true
	})
	if !f.DirectPeerWrites {
		assert.Zero(t, okAfter.Load(), "batches posted after Revoke returned reported success")
	}
	t.Logf("%d batches posted", posted.Load())
}
