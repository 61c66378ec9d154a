//go:build ucx

package ucx

import (
	"bytes"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEpochFence checks the access point's fence (doc.go, "Epochs"): once a
// write of a later epoch landed, a write of an earlier one (what a broken
// connection still carried, arriving late) is refused and not applied, and
// its batch fails as resumable (not as a revocation). The late message is
// made by stamping a write with the old epoch after the newer one landed:
// the order in which a receiver handles a dead connection's leftovers and
// a fresh connection's writes is the network's, and this is the order the
// fence exists for.
func TestEpochFence(t *testing.T) {
	eachFabricIn(t, []WriteMode{WriteMessages}, func(t *testing.T) {
		const page = 4096
		from, err := New(Options{Name: "prefill", CloseDrain: time.Second})
		require.NoError(t, err)
		to, err := New(Options{Name: "decode", CloseDrain: time.Second})
		require.NoError(t, err)
		src, err := hostmem.Alloc(4 * page)
		require.NoError(t, err)
		dst, err := hostmem.Alloc(2 * page)
		require.NoError(t, err)
		t.Cleanup(func() { _ = from.Close(); _ = to.Close(); _ = src.Free(); _ = dst.Free() })
		sreg, err := from.Register(src.Addr, 4*page)
		require.NoError(t, err)
		dreg, err := to.Register(dst.Addr, 2*page)
		require.NoError(t, err)
		a, err := to.OpenPeerAccess()
		require.NoError(t, err)
		for i, v := range []byte{'a', 'b', 'c', 'd'} {
			fill(src.Bytes[i*page:(i+1)*page], v)
		}
		connect := func() (*Endpoint, rdma.RemoteKey) {
			ep, err := from.Connect(a.Address())
			require.NoError(t, err)
			rk, err := ep.Import(dreg.Desc())
			require.NoError(t, err)
			return ep.(*Endpoint), rk
		}
		// post writes source page s over both destination pages: the
		// batch's outcome, or Post's own refusal of an endpoint already
		// closed (a revoked access point's refusal of the connection can
		// reach the sender before its Post).
		post := func(ep *Endpoint, rk rdma.RemoteKey, s int) error {
			ch := make(chan error, 1)
			ws := []rdma.Write{
				{Src: src.Addr + uint64(s*page), Dst: dst.Addr, Len: page, Local: sreg.Key(), Remote: rk},
				{Src: src.Addr + uint64(s*page), Dst: dst.Addr + page, Len: page, Local: sreg.Key(), Remote: rk},
			}
			if err := ep.Post(ws, func(err error) { ch <- err }); err != nil {
				return err
			}
			return waitErr(t, ch)
		}
		want := func(v byte) {
			t.Helper()
			require.Equal(t, bytes.Repeat([]byte{v}, 2*page), dst.Bytes, "destination holds %q", v)
		}

		// Two endpoints to one access point (two submitters of one
		// prefill), both at epoch 0.
		old, rkOld := connect()
		cur, rkCur := connect()
		require.Same(t, old.epochs, cur.epochs, "one epoch count per address")
		require.NoError(t, post(old, rkOld, 0))
		want('a')
		assert.True(t, old.epochs.fenced.Load(), "an access point says it fences")

		// An endpoint to the access point broke (counted): writes now
		// carry epoch 1, and one landed.
		cur.epochs.n.Store(1)
		require.NoError(t, post(cur, rkCur, 1))
		want('b')

		// A write of epoch 0 arrives after it: refused, not applied.
		old.epochs.n.Store(0)
		err = post(old, rkOld, 2)
		old.epochs.n.Store(1)
		require.Error(t, err, "a write of an old epoch after a later one landed")
		want('b')
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
		assert.False(t, errors.Is(err, rdma.ErrRevoked), "a stale write is re-sent, not given up: %v", err)
		assert.False(t, errors.Is(err, rdma.ErrNotQuiesced), "nothing of it can land after its refusal: %v", err)
		assert.Contains(t, err.Error(), "old epoch")
		// Its connection drained: its Close confirms quiescence.
		require.NoError(t, old.Close())

		// Its re-send on a fresh endpoint carries the current epoch and
		// lands; so do the other endpoint's writes.
		fresh, rkFresh := connect()
		require.NoError(t, post(fresh, rkFresh, 2))
		want('c')
		require.NoError(t, post(cur, rkCur, 3))
		want('d')
		require.NoError(t, fresh.Close())
		require.NoError(t, cur.Close())

		// A revocation is no stale refusal: not re-sent.
		ep, rk := connect()
		require.NoError(t, a.Revoke())
		err = post(ep, rk, 0)
		require.Error(t, err)
		assert.True(t, errors.Is(err, rdma.ErrRevoked), "%v", err)
		want('d')
		_ = ep.Close()
	})
}

// TestBrokenEndpointNotQuiesced checks what a broken connection's Close
// and batches say in WriteMessages: the receiver may still apply what the
// connection carried, so ErrNotQuiesced; and ErrFenced only where the
// receiver fences (an access point), never for the transport's own worker.
func TestBrokenEndpointNotQuiesced(t *testing.T) {
	eachFabricIn(t, []WriteMode{WriteMessages}, func(t *testing.T) {
		for _, access := range []bool{true, false} {
			f := newFixtureOpts(t, 1<<16, Options{CloseDrain: 300 * time.Millisecond})
			addr := f.to.Address()
			if access {
				a, err := f.to.OpenPeerAccess()
				require.NoError(t, err)
				addr = a.Address()
			}
			ep, err := f.from.Connect(addr)
			require.NoError(t, err)
			rk, err := ep.Import(f.dreg.Desc())
			require.NoError(t, err)
			ch := make(chan error, 1)
			w := rdma.Write{Src: f.src.Addr, Dst: f.dst.Addr, Len: 4096, Local: f.sreg.Key(), Remote: rk}
			require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) { ch <- err }))
			require.NoError(t, waitErr(t, ch))
			e := ep.(*Endpoint)
			n := e.epochs.n.Load()
			// The connection fails (as UCX's error handler reports it).
			require.NoError(t, f.from.do(func() error {
				f.from.endpointFailed(e, errors.New("connection reset (test)"))
				return nil
			}))
			assert.Equal(t, n+1, e.epochs.n.Load(), "a broken endpoint is counted")
			err = ep.Close()
			require.Error(t, err, "access point %v", access)
			assert.True(t, errors.Is(err, rdma.ErrNotQuiesced), "%v", err)
			assert.Equal(t, access, errors.Is(err, rdma.ErrFenced), "%v", err)
		}
	})
}

// TestEpochFenceSeveralSenders: two transports write through one access
// point (several transports of one peer), each with its own count. Once
// one's later epoch landed, the other's writes are refused as stale, not
// applied; the refusal carries the fence, which the other adopts, so that
// its re-send on a fresh endpoint lands instead of being refused again.
func TestEpochFenceSeveralSenders(t *testing.T) {
	eachFabricIn(t, []WriteMode{WriteMessages}, func(t *testing.T) {
		const page = 4096
		var froms [2]*Transport
		for i := range froms {
			tr, err := New(Options{Name: "prefill", CloseDrain: time.Second})
			require.NoError(t, err)
			froms[i] = tr
		}
		to, err := New(Options{Name: "decode", CloseDrain: time.Second})
		require.NoError(t, err)
		src, err := hostmem.Alloc(2 * page)
		require.NoError(t, err)
		dst, err := hostmem.Alloc(page)
		require.NoError(t, err)
		t.Cleanup(func() { _ = froms[0].Close(); _ = froms[1].Close(); _ = to.Close(); _ = src.Free(); _ = dst.Free() })
		fill(src.Bytes[:page], 'a')
		fill(src.Bytes[page:], 'b')
		dreg, err := to.Register(dst.Addr, page)
		require.NoError(t, err)
		a, err := to.OpenPeerAccess()
		require.NoError(t, err)
		post := func(from *Transport, s int) (*Endpoint, error) {
			sreg, err := from.Register(src.Addr+uint64(s*page), page)
			require.NoError(t, err)
			ep, err := from.Connect(a.Address())
			require.NoError(t, err)
			rk, err := ep.Import(dreg.Desc())
			require.NoError(t, err)
			ch := make(chan error, 1)
			require.NoError(t, ep.Post([]rdma.Write{{Src: src.Addr + uint64(s*page), Dst: dst.Addr, Len: page, Local: sreg.Key(), Remote: rk}}, func(err error) { ch <- err }))
			err = waitErr(t, ch)
			require.NoError(t, sreg.Deregister())
			return ep.(*Endpoint), err
		}
		// The first sender's endpoint to the access point broke twice.
		ep0, err := post(froms[0], 0)
		require.NoError(t, err)
		ep0.epochs.n.Store(2)
		ep0b, err := post(froms[0], 0)
		require.NoError(t, err)
		require.Equal(t, bytes.Repeat([]byte{'a'}, page), dst.Bytes)

		ep1, err := post(froms[1], 1)
		require.Error(t, err, "epoch 0 after epoch 2 landed")
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
		assert.False(t, errors.Is(err, rdma.ErrRevoked), "%v", err)
		require.Equal(t, bytes.Repeat([]byte{'a'}, page), dst.Bytes, "not applied")
		assert.Equal(t, uint32(2), ep1.epochs.n.Load(), "the refusal's fence adopted")
		ep1b, err := post(froms[1], 1)
		require.NoError(t, err, "the re-send carries the fence's epoch")
		require.Equal(t, bytes.Repeat([]byte{'b'}, page), dst.Bytes)
		for _, ep := range []*Endpoint{ep0, ep0b, ep1, ep1b} {
			require.NoError(t, ep.Close())
		}
	})
}
