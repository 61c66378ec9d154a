//go:build ucx

package ucx

import (
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/require"
)

// TestCloseInDoneWhileDraining: a batch's done callback closes its
// endpoint, which another goroutine's Close is draining, and the answer
// that completed the batch is the last one the drain waited for. The
// callback's Close waited, on the progress goroutine, for an event that
// was never to come (the drain's end was looked for only once the
// callbacks returned): every endpoint of the transport stood still until
// the drain's bound, and both Closes then said the writes may still land.
// Now both return nil: everything was answered.
func TestCloseInDoneWhileDraining(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const page = 4096
	// A drain bound far beyond the test's: the defect made both Closes
	// wait it out and fail.
	from, err := New(Options{Name: "prefill", CloseDrain: 20 * time.Second})
	require.NoError(t, err)
	to, err := New(Options{Name: "decode"})
	require.NoError(t, err)
	src, err := hostmem.Alloc(page)
	require.NoError(t, err)
	dst, err := hostmem.Alloc(page)
	require.NoError(t, err)
	t.Cleanup(func() { _ = from.Close(); _ = to.Close(); _ = src.Free(); _ = dst.Free() })
	sreg, err := from.Register(src.Addr, page)
	require.NoError(t, err)
	dreg, err := to.Register(dst.Addr, page)
	require.NoError(t, err)
	ep, err := from.Connect(to.Address())
	require.NoError(t, err)
	rk, err := ep.Import(dreg.Desc())
	require.NoError(t, err)
	w := rdma.Write{Src: src.Addr, Dst: dst.Addr, Len: page, Local: sreg.Key(), Remote: rk}
	ch := make(chan error, 1)
	require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) { ch <- err }))
	require.NoError(t, waitErr(t, ch)) // connected

	// The receiver answers nothing until released.
	release, held := make(chan struct{}), make(chan struct{})
	go func() { _ = to.do(func() error { close(held); <-release; return nil }) }()
	<-held
	type result struct{ batch, close error }
	inDone := make(chan result, 1)
	require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) {
		inDone <- result{err, ep.Close()} // on the progress goroutine
	}))
	outer := make(chan error, 1)
	go func() { outer <- ep.Close() }() // starts the drain
	// The drain has begun (read on the sender's progress goroutine).
	e := ep.(*Endpoint)
	for {
		var draining bool
		require.NoError(t, from.do(func() error { draining = e.lstate == epDraining; return nil }))
		if draining {
			break
		}
		time.Sleep(time.Millisecond) // polled: the outer Close's request reaches the loop
	}
	close(release)
	r := <-inDone
	require.NoError(t, r.batch)
	require.NoError(t, r.close, "the Close in the done callback: every write was answered")
	require.NoError(t, <-outer, "the draining Close")
}
