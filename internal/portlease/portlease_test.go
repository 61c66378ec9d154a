//go:build linux

package portlease

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hold holds a port of host until the test ends.
func hold(t *testing.T, host string, shared bool) *Lease {
	t.Helper()
	l, err := Take(host, shared)
	require.NoError(t, err)
	t.Cleanup(l.Release)
	require.Positive(t, l.Port)
	return l
}

// reach listens on addr and checks that a dial reaches that listener.
func reach(t *testing.T, addr string) {
	t.Helper()
	srv, err := net.Listen("tcp", addr)
	require.NoError(t, err, "a listener binds %s", addr)
	defer srv.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := srv.Accept()
		if err == nil {
			_ = c.Close()
		}
		accepted <- err
	}()
	_, port, err := net.SplitHostPort(srv.Addr().String())
	require.NoError(t, err)
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, <-accepted)
}

// ipv6 reports whether IPv6's loopback can be listened on here.
func ipv6(t *testing.T) bool {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		return false
	}
	require.NoError(t, l.Close())
	return true
}

// TestHeldPort: a held port refuses dials; a listener that sets
// SO_REUSEADDR (Go's) may bind it only when the lease is shared; after
// Release anyone may. Every interface ("" or 0.0.0.0) holds IPv4's
// loopback and IPv6's too.
func TestHeldPort(t *testing.T) {
	v6 := ipv6(t)
	for _, host := range []string{"127.0.0.1", "0.0.0.0", ""} {
		t.Run("host="+host, func(t *testing.T) {
			excl := hold(t, host, false)
			_, err := net.DialTimeout("tcp", excl.Addr("127.0.0.1"), 5*time.Second)
			require.True(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)
			taken := []string{excl.Addr(host), excl.Addr("127.0.0.1")}
			if host != "127.0.0.1" && v6 {
				taken = append(taken, excl.Addr("::1"))
			}
			for _, addr := range taken {
				_, err = net.Listen("tcp", addr)
				require.True(t, errors.Is(err, syscall.EADDRINUSE), "%s is held: %v", addr, err)
			}
			excl.Release()
			excl.Release() // twice is harmless
			reach(t, excl.Addr(host))

			shared := hold(t, host, true)
			_, err = net.DialTimeout("tcp", shared.Addr("127.0.0.1"), 5*time.Second)
			require.True(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)
			reach(t, shared.Addr(host))
		})
	}
}

// TestZeroLeaseHoldsNothing: releasing a Lease never taken closes nothing
// (not descriptor 0).
func TestZeroLeaseHoldsNothing(t *testing.T) {
	var l Lease
	l.Release()
	_, err := os.Stdin.Stat()
	require.NoError(t, err, "stdin is still open")
}

// TestPortZeroAvoidsHeld: no bind to port 0 of an address a lease covers
// is given the held port, of either kind: 127.0.0.1 is covered by leases
// on it and on every interface, ::1 by those on every interface. (A bind
// to ::1 may be given a port held on 127.0.0.1 alone: the two do not
// meet, and the lease's listener binds 127.0.0.1 all the same.
// Connections' source ports are not checked: Linux gives them even ports
// first and port-0 binds, the leases' too, odd ones, so such a check could
// not fail.)
func TestPortZeroAvoidsHeld(t *testing.T) {
	covers := map[string]map[int]bool{"127.0.0.1:0": {}, "[::1]:0": {}}
	for i := range 64 {
		host := []string{"127.0.0.1", "0.0.0.0"}[i%2]
		port := hold(t, host, i%4 >= 2).Port
		covers["127.0.0.1:0"][port] = true
		if host == "0.0.0.0" {
			covers["[::1]:0"][port] = true
		}
	}
	require.Len(t, covers["127.0.0.1:0"], 64)
	binds := []string{"127.0.0.1:0"}
	if ipv6(t) {
		binds = append(binds, "[::1]:0")
	}
	for i := range 512 {
		addr := binds[i%len(binds)]
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		require.False(t, covers[addr][port], "a bind to %s was given %d, which is held", addr, port)
	}
}

// TestTakeNamesABadHost: a host that is not an IP address, or a zone that
// is no interface, is an error naming it.
func TestTakeNamesABadHost(t *testing.T) {
	_, err := Take("localhost", true)
	require.ErrorContains(t, err, `"localhost"`)
	_, err = Take("fe80::1%no-such-interface", true)
	require.ErrorContains(t, err, `"no-such-interface"`)
}
