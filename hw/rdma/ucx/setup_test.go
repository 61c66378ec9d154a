//go:build ucx

package ucx

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A connecting peer for TestPeerKilledDuringConnectionSetup: the test
// binary re-executed with setupPeerEnv set reads one line from stdin,
// "<address> <addr> <len> <key>" (hex, decimal, decimal, hex: an access
// point and a region behind it), connects to the address, posts one write
// of setupPeerEnv bytes into the region and prints "posted"; then it waits
// to be killed.
const setupPeerEnv = "KVSTREAM_UCX_SETUP_PEER_BYTES"

func runSetupPeer() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "setup peer:", err); return 1 }
	n, err := strconv.Atoi(os.Getenv(setupPeerEnv))
	if err != nil {
		return fail(err)
	}
	var a, k string
	var desc rdma.RegionDesc
	if _, err := fmt.Fscan(bufio.NewReader(os.Stdin), &a, &desc.Addr, &desc.Len, &k); err != nil {
		return fail(err)
	}
	addr, err := hex.DecodeString(a)
	if err != nil {
		return fail(err)
	}
	if desc.Key, err = hex.DecodeString(k); err != nil {
		return fail(err)
	}
	tr, err := New(Options{Name: "setup-peer"})
	if err != nil {
		return fail(err)
	}
	mem, err := hostmem.Alloc(n)
	if err != nil {
		return fail(err)
	}
	reg, err := tr.Register(mem.Addr, uint64(n))
	if err != nil {
		return fail(err)
	}
	ep, err := tr.Connect(addr)
	if err != nil {
		return fail(err)
	}
	rk, err := ep.Import(desc)
	if err != nil {
		return fail(err)
	}
	w := []rdma.Write{{Src: mem.Addr, Dst: desc.Addr, Len: uint64(n), Local: reg.Key(), Remote: rk}}
	if err := ep.Post(w, func(error) {}); err != nil {
		return fail(err)
	}
	fmt.Println("posted")
	select {} // until killed
}

// TestPeerKilledDuringConnectionSetup: a receiving Transport (this test's)
// opens an access point per peer process, and each peer is killed
// (SIGKILL) while it connects: in even rounds while the receiver's
// progress goroutine is held, so that the receiver takes the peer's
// connection request or wireup message only once the peer is dead (the
// connect-back of UCX's worker-address wireup then fails with its reply
// queued: over tcp, UCX 1.13 aborted the process purging it); in odd ones
// at a random instant up to 20 ms after its write was posted, with the
// receiver running. The access point is then revoked, as a decode does
// with a lost session, and destroyed (at once, or after a short linger).
// The receiver must survive every round (an abort kills this test), and a
// new peer must still connect and write afterwards.
func TestPeerKilledDuringConnectionSetup(t *testing.T) {
	const rounds = 16
	const n = 64 << 10
	for _, fab := range fabrics {
		t.Run(fab.name, func(t *testing.T) {
			t.Setenv("UCX_TLS", fab.tls)
			for _, linger := range []time.Duration{-1, 20 * time.Millisecond} {
				to, err := New(Options{Name: "decode", RevokeLinger: linger, AccessConnect: AccessListener})
				require.NoError(t, err)
				dst, err := hostmem.Alloc(n)
				require.NoError(t, err)
				dreg, err := to.Register(dst.Addr, n)
				require.NoError(t, err)
				rng := rand.New(rand.NewPCG(1, uint64(linger)))
				for i := range rounds {
					a, err := to.OpenPeerAccess()
					require.NoError(t, err)
					if fab.tls == "tcp" {
						assert.True(t, isListenAddr(a.Address()), "over tcp an access point gives out its listener")
					}
					hold := i%2 == 0
					killSetupPeer(t, to, a, dreg.Desc(), n, hold, time.Duration(rng.IntN(20_000))*time.Microsecond)
					// Over shared memory a revocation in the message mode is a
					// barrier too; either way it must not fail.
					require.NoError(t, a.Revoke(), "round %d", i)
				}
				// The receiver still serves: a live peer writes through a new
				// access point.
				live := newLiveWriter(t, to, dreg, dst, n)
				live()
				require.NoError(t, dreg.Deregister())
				require.NoError(t, to.Close())
				require.NoError(t, dst.Free())
			}
		})
	}
}

// killSetupPeer starts a connecting peer on access point a and kills it:
// with hold, while to's progress goroutine is held (from before the peer
// connects until it is dead); else after delay, once it posted.
func killSetupPeer(t *testing.T, to *Transport, a rdma.PeerAccess, desc rdma.RegionDesc, n int, hold bool, delay time.Duration) {
	t.Helper()
	release := make(chan struct{})
	released := false
	unhold := func() {
		if !released {
			released = true
			close(release)
		}
	}
	defer unhold()
	if hold {
		held := make(chan struct{})
		go func() {
			_ = to.do(func() error { close(held); <-release; return nil })
		}()
		<-held
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", setupPeerEnv, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	_, err = fmt.Fprintf(stdin, "%s %d %d %s\n", hex.EncodeToString(a.Address()), desc.Addr, desc.Len, hex.EncodeToString(desc.Key))
	require.NoError(t, err)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the peer exited before it posted")
	require.Equal(t, "posted\n", line)
	if hold {
		// Let the peer's progress send what it can while the receiver takes
		// nothing: its connection request, or its wireup request and write.
		time.Sleep(5 * time.Millisecond)
	} else {
		time.Sleep(delay)
	}
	require.NoError(t, cmd.Process.Kill())
	st, err := cmd.Process.Wait()
	require.NoError(t, err)
	ws, ok := st.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the peer died of SIGKILL: %v", st)
	unhold()
	// In even rounds the receiver takes what the dead peer left (connection
	// request, wireup, a failed connect-back) before its access point is
	// revoked.
	// In odd rounds the access point is revoked at once, with whatever
	// setup state is pending.
	if hold {
		require.NoError(t, to.do(func() error {
			to.progressUntil(func() bool { return false }, 20*time.Millisecond)
			return nil
		}))
	}
}

// newReceiver returns a transport of opts with n bytes registered, all
// freed when the test ends (the region, then the memory, then the
// transport).
func newReceiver(t *testing.T, opts Options, n int) (*Transport, *hostmem.Block, rdma.Region) {
	t.Helper()
	to, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = to.Close() })
	dst, err := hostmem.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dst.Free() })
	dreg, err := to.Register(dst.Addr, uint64(n))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dreg.Deregister() })
	return to, dst, dreg
}

// newLiveWriter returns a check that a peer in this process connects to a
// new access point of to and writes n bytes that land in dst.
func newLiveWriter(t *testing.T, to *Transport, dreg rdma.Region, dst *hostmem.Block, n int) func() {
	return newLiveWriterOf(t, Options{Name: "prefill"}, to, dreg, dst, n)
}

// newLiveWriterOf is newLiveWriter with a peer of options opts.
func newLiveWriterOf(t *testing.T, opts Options, to *Transport, dreg rdma.Region, dst *hostmem.Block, n int) func() {
	return func() {
		from, err := New(opts)
		require.NoError(t, err)
		defer from.Close()
		a, err := to.OpenPeerAccess()
		require.NoError(t, err)
		defer func() { _ = a.Revoke() }()
		src, err := hostmem.Alloc(n)
		require.NoError(t, err)
		defer src.Free()
		fillPattern(src.Bytes)
		sreg, err := from.Register(src.Addr, uint64(n))
		require.NoError(t, err)
		ep, err := from.Connect(a.Address())
		require.NoError(t, err)
		defer ep.Close()
		rk, err := ep.Import(dreg.Desc())
		require.NoError(t, err)
		done := make(chan error, 1)
		require.NoError(t, ep.Post([]rdma.Write{{Src: src.Addr, Dst: dst.Addr, Len: uint64(n), Local: sreg.Key(), Remote: rk}}, func(err error) { done <- err }))
		require.NoError(t, waitErr(t, done))
		assert.True(t, bytes.Equal(src.Bytes, dst.Bytes), "the live peer's bytes landed")
	}
}

// TestListenAddresses: an access point's listener address survives its
// encoding, a peer's malformed one is refused before UCX sees it, and
// which UCX_TLS values take connections through a listener.
func TestListenAddresses(t *testing.T) {
	for _, ip := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), netip.MustParseAddr("10.1.2.3")} {
		b := encodeListenAddr(ip, 4242)
		require.True(t, isListenAddr(b))
		// Its first byte is no worker address format version.
		require.Error(t, checkWorkerAddress(b))
		got, port, err := decodeListenAddr(b)
		require.NoError(t, err)
		assert.Equal(t, ip, got)
		assert.Equal(t, uint16(4242), port)
	}
	good := encodeListenAddr(netip.MustParseAddr("127.0.0.1"), 4242)
	for name, b := range map[string][]byte{
		"short":          good[:len(good)-1],
		"long":           append(append([]byte(nil), good...), 0),
		"length lies":    append(append([]byte(nil), good[:4]...), append([]byte{16}, good[5:]...)...),
		"port 0":         encodeListenAddr(netip.MustParseAddr("127.0.0.1"), 0),
		"unspecified v4": encodeListenAddr(netip.IPv4Unspecified(), 1),
		"unspecified v6": encodeListenAddr(netip.IPv6Unspecified(), 1),
		"multicast":      encodeListenAddr(netip.MustParseAddr("224.0.0.1"), 1),
	} {
		_, _, err := decodeListenAddr(b)
		assert.Error(t, err, name)
	}

	t.Setenv("UCX_TLS", "tcp")
	tr, err := New(Options{Name: "garbage", AccessConnect: AccessListener})
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.Connect(good[:len(good)-1])
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	a, err := tr.OpenPeerAccess()
	require.NoError(t, err)
	assert.True(t, isListenAddr(a.Address()), "message writes over tcp: a listener")
	require.NoError(t, a.Revoke())
	rma, err := New(Options{Name: "rma", Writes: WriteRMA})
	require.NoError(t, err)
	defer rma.Close()
	a, err = rma.OpenPeerAccess()
	require.NoError(t, err)
	assert.NoError(t, checkWorkerAddress(a.Address()), "WriteRMA: the worker address")
	require.NoError(t, a.Revoke())

	v113, v118 := [2]int{1, 13}, [2]int{1, 18}
	for _, c := range []struct {
		c    AccessConnect
		w    WriteMode
		tls  string
		v    [2]int
		want bool
	}{
		{AccessAuto, WriteMessages, "tcp", v113, true},
		{AccessAuto, WriteMessages, "", v113, true},
		{AccessAuto, WriteMessages, "sm,self", v113, false},
		{AccessAuto, WriteRMA, "tcp", v113, false},
		{AccessAuto, WriteMessages, "tcp", v118, false},
		{AccessAuto, WriteMessages, "tcp", [2]int{2, 0}, false},
		{AccessListener, WriteMessages, "tcp", v118, true},
		{AccessListener, WriteRMA, "tcp", v118, true},
		{AccessListener, WriteMessages, "sm,self", v113, false},
		{AccessWorkerAddress, WriteMessages, "tcp", v113, false},
	} {
		assert.Equal(t, c.want, c.c.listens(c.w, c.tls, c.v), "%+v", c)
	}
	_, err = New(Options{Name: "bad", AccessConnect: 7})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Options.AccessConnect")

	for tls, want := range map[string]bool{
		"": true, "all": true, "tcp": true, "sm,tcp,self": true, `\tcp`: true, "rc,self": true, "ud:aux": true,
		"sm,self": false, "shm,self": false, "posix,cma,self": false, "^tcp": false, "^sm": true,
	} {
		assert.Equal(t, want, connectsBySockaddr(tls), "UCX_TLS=%q", tls)
	}

	for host, bad := range map[string]bool{"": false, "127.0.0.1": false, "::1": false, "0.0.0.0": true, "::": true, "224.0.0.1": true, "no-such-host.invalid": true} {
		_, err := accessHost(host)
		assert.Equal(t, bad, err != nil, "Options.AccessHost %q: %v", host, err)
	}
	_, err = New(Options{Name: "bad host", AccessHost: "0.0.0.0"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Options.AccessHost")
}

// TestHalfOpenConnectionOutlivesRevoke: a peer that connected to an access
// point's listener but sent nothing yet (stopped between its connect and
// its first send) sends its connection header only after the access point
// was revoked, then again after its worker is gone. UCX 1.13 frees a
// listener that such a connection still points to, so the listener must
// live as long as the worker; the receiver must survive and serve on.
func TestHalfOpenConnectionOutlivesRevoke(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const n = 4 << 10
	to, dst, dreg := newReceiver(t, Options{Name: "decode", RevokeLinger: 200 * time.Millisecond, AccessConnect: AccessListener}, n)
	for round := range 4 {
		a, err := to.OpenPeerAccess()
		require.NoError(t, err)
		ip, port, err := decodeListenAddr(a.Address())
		require.NoError(t, err)
		conns := make([]net.Conn, 3)
		for i := range conns {
			conns[i], err = net.Dial("tcp", netip.AddrPortFrom(ip, port).String())
			require.NoError(t, err, "round %d", round)
		}
		require.NoError(t, a.Revoke())
		// A header announcing no private data: UCX reads it whole and
		// hands the request to the listener, which refuses it.
		hdr := make([]byte, 16)
		_, err = conns[0].Write(hdr)
		require.NoError(t, err)
		// Wait for the worker's end (its linger), then send on another.
		acc := a.(*access)
		deadline := time.Now().Add(30 * time.Second)
		for {
			var gone bool
			require.NoError(t, to.do(func() error { gone = acc.w == nil; return nil }))
			if gone {
				break
			}
			require.True(t, time.Now().Before(deadline), "the revoked access point's worker was not destroyed within 30s")
			time.Sleep(10 * time.Millisecond)
		}
		_, _ = conns[1].Write(hdr) // the socket may be closed already
		for _, c := range conns {
			_ = c.Close()
		}
	}
	newLiveWriter(t, to, dreg, dst, n)()
}

// TestHalfOpenConnectionOutlivesRevokeLost: as
// TestHalfOpenConnectionOutlivesRevoke, for an access point of a WriteRMA
// transport whose peer connects through its listener, cut off with
// RevokeLost. Parked (never destroyed), its worker lost its listener while
// a half-accepted connection still pointed to it, and the header sent
// afterwards crashed the receiver (UCX 1.13); RevokeLost destroys such an
// access point as Revoke does. The receiver must survive and serve on, and
// a peer connecting after the cut fails at once instead of waiting for an
// answer.
func TestHalfOpenConnectionOutlivesRevokeLost(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const n = 4 << 10
	to, dst, dreg := newReceiver(t, Options{Name: "decode", Writes: WriteRMA, AccessConnect: AccessListener}, n)
	// Where UCX asserts on RMA puts through a client-server endpoint, a
	// WriteRMA sender refuses a listener's address instead of aborting.
	refuses := assertsOnEarlyKeys(ucxVersion())
	// late connects to a cut access point and posts: the batch fails.
	late := func(addr []byte) {
		from, err := New(Options{Name: "late", Writes: WriteRMA})
		require.NoError(t, err)
		defer from.Close()
		src, err := hostmem.Alloc(n)
		require.NoError(t, err)
		defer src.Free()
		sreg, err := from.Register(src.Addr, uint64(n))
		require.NoError(t, err)
		ep, err := from.Connect(addr)
		if refuses {
			require.ErrorContains(t, err, "proto_common.inl:219")
			require.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
			return
		}
		require.NoError(t, err)
		defer ep.Close()
		rk, err := ep.Import(dreg.Desc())
		if err != nil {
			return // refused already
		}
		done := make(chan error, 1)
		if err := ep.Post([]rdma.Write{{Src: src.Addr, Dst: dst.Addr, Len: uint64(n), Local: sreg.Key(), Remote: rk}}, func(err error) { done <- err }); err != nil {
			return
		}
		require.Error(t, waitErr(t, done), "a write through a cut access point")
	}
	for round := range 4 {
		a, err := to.OpenPeerAccess()
		require.NoError(t, err)
		ip, port, err := decodeListenAddr(a.Address())
		require.NoError(t, err, "round %d: the access point listens", round)
		conns := make([]net.Conn, 3)
		for i := range conns {
			conns[i], err = net.Dial("tcp", netip.AddrPortFrom(ip, port).String())
			require.NoError(t, err, "round %d", round)
		}
		require.NoError(t, a.(rdma.LostPeerRevoker).RevokeLost())
		require.NoError(t, to.do(func() error {
			assert.Zero(t, int(to.ctx.nparked), "round %d: no access point with a listener is parked", round)
			return nil
		}))
		// The header UCX's connection manager reads whole and hands to
		// the listener (TestHalfOpenConnectionOutlivesRevoke).
		hdr := make([]byte, 16)
		for _, c := range conns {
			_, _ = c.Write(hdr)
		}
		if round == 0 {
			late(a.Address())
		}
		// The connection manager's async thread reads it: a round trip
		// of the transport's progress goroutine does not wait for that,
		// the next round's connections and the live writer below do.
		require.NoError(t, to.do(func() error { return nil }))
		for _, c := range conns {
			_ = c.Close()
		}
	}
	if refuses {
		return // no WriteRMA peer writes through a listener (late, above)
	}
	// A live peer connects after the half-open ones and writes.
	newLiveWriterOf(t, Options{Name: "prefill", Writes: WriteRMA}, to, dreg, dst, n)()
}

// TestAccessPointTakesReconnections: a prefill reconnects to its access
// point each time an endpoint broke (its submitters resume on a fresh
// connection), many times over a long session. The listener's bound is on
// the connections open at once, not on those the session ever made: every
// reconnection is served, each after the peer closed the one before.
func TestAccessPointTakesReconnections(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const n = 4 << 10
	to, err := New(Options{Name: "decode", AccessConnect: AccessListener})
	require.NoError(t, err)
	defer to.Close()
	dst, err := hostmem.Alloc(n)
	require.NoError(t, err)
	defer dst.Free()
	dreg, err := to.Register(dst.Addr, n)
	require.NoError(t, err)
	defer dreg.Deregister()
	a, err := to.OpenPeerAccess()
	require.NoError(t, err)
	defer func() { _ = a.Revoke() }()
	from, err := New(Options{Name: "prefill"})
	require.NoError(t, err)
	defer from.Close()
	src, err := hostmem.Alloc(n)
	require.NoError(t, err)
	defer src.Free()
	sreg, err := from.Register(src.Addr, uint64(n))
	require.NoError(t, err)
	for round := range 3 * acceptMax {
		src.Bytes[0] = byte(round)
		ep, err := from.Connect(a.Address())
		require.NoError(t, err)
		rk, err := ep.Import(dreg.Desc())
		require.NoError(t, err)
		done := make(chan error, 1)
		require.NoError(t, ep.Post([]rdma.Write{{Src: src.Addr, Dst: dst.Addr, Len: uint64(n), Local: sreg.Key(), Remote: rk}}, func(err error) { done <- err }))
		require.NoError(t, waitErr(t, done), "connection %d to the access point", round+1)
		require.Equal(t, byte(round), dst.Bytes[0], "connection %d: its write landed", round+1)
		require.NoError(t, ep.Close())
	}
}
