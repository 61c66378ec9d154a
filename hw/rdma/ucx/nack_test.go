//go:build ucx

package ucx

import (
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/require"
)

// TestRefusalAnswersItsOwnConnection: two connections to one access point
// (two submitters of one prefill), a write refused on one (its region was
// deregistered) and a batch of good writes on the other, handled by the
// receiver in one go. Each FLUSH answers for its own connection's writes:
// the refusal was kept once per worker, so the other connection's FLUSH
// took it (its good batch failed) and the refused write's own batch
// completed as landed although its bytes were dropped.
//
// The pauses before each post only make it likely that the second
// connection's FLUSH is handled between the refused write and its own
// connection's FLUSH (the interleaving that showed the defect); the
// verdicts checked hold whatever the order.
func TestRefusalAnswersItsOwnConnection(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const page = 4096
	const big = 2 << 20
	from, err := New(Options{Name: "prefill", CloseDrain: time.Second})
	require.NoError(t, err)
	to, err := New(Options{Name: "decode", CloseDrain: time.Second})
	require.NoError(t, err)
	src, err := hostmem.Alloc(big + page)
	require.NoError(t, err)
	x, err := hostmem.Alloc(page)
	require.NoError(t, err)
	y, err := hostmem.Alloc(4 << 20)
	require.NoError(t, err)
	t.Cleanup(func() { _ = from.Close(); _ = to.Close(); _ = src.Free(); _ = x.Free(); _ = y.Free() })
	sreg, err := from.Register(src.Addr, big+page)
	require.NoError(t, err)
	xreg, err := to.Register(x.Addr, page)
	require.NoError(t, err)
	yreg, err := to.Register(y.Addr, 4<<20)
	require.NoError(t, err)
	a, err := to.OpenPeerAccess()
	require.NoError(t, err)
	type conn struct {
		ep     rdma.Endpoint
		rx, ry rdma.RemoteKey
	}
	connect := func() conn {
		ep, err := from.Connect(a.Address())
		require.NoError(t, err)
		rx, err := ep.Import(xreg.Desc())
		require.NoError(t, err)
		ry, err := ep.Import(yreg.Desc())
		require.NoError(t, err)
		return conn{ep, rx, ry}
	}
	post := func(c conn, ws []rdma.Write) chan error {
		ch := make(chan error, 1)
		require.NoError(t, c.ep.Post(ws, func(err error) { ch <- err }))
		return ch
	}
	c1, c2 := connect(), connect()
	// Warm both connections up (wireup needs the receiver's progress).
	for _, c := range []conn{c1, c2} {
		require.NoError(t, waitErr(t, post(c, []rdma.Write{{Src: src.Addr, Dst: y.Addr, Len: page, Local: sreg.Key(), Remote: c.ry}})))
	}
	require.NoError(t, xreg.Deregister()) // c1's next write to x is refused

	release := make(chan struct{})
	held := make(chan struct{})
	go func() { _ = to.do(func() error { close(held); <-release; return nil }) }()
	<-held
	// c1: a write the receiver refuses, then a large one it applies.
	ch1 := post(c1, []rdma.Write{
		{Src: src.Addr, Dst: x.Addr, Len: 64, Local: sreg.Key(), Remote: c1.rx},
		{Src: src.Addr + page, Dst: y.Addr, Len: big, Local: sreg.Key(), Remote: c1.ry},
	})
	time.Sleep(50 * time.Millisecond)
	// c2: a good write to y.
	ch2 := post(c2, []rdma.Write{{Src: src.Addr, Dst: y.Addr + 3<<20, Len: page, Local: sreg.Key(), Remote: c2.ry}})
	time.Sleep(50 * time.Millisecond)
	close(release)
	err1, err2 := waitErr(t, ch1), waitErr(t, ch2)
	require.Error(t, err1, "c1's write to a deregistered region was dropped, yet its batch reports success")
	require.NoError(t, err2, "c2's batch was refused for c1's write")
}
