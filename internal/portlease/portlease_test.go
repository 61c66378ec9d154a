//go:build unix

package portlease

import (
	"errors"
	"net"
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

// TestHeldPort: a held port refuses dials; a listener that sets
// SO_REUSEADDR (Go's) may bind it only when the lease is shared; after
// Release anyone may. Every interface ("") holds IPv4's loopback too.
func TestHeldPort(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "0.0.0.0", ""} {
		t.Run("host="+host, func(t *testing.T) {
			excl := hold(t, host, false)
			_, err := net.DialTimeout("tcp", excl.Addr("127.0.0.1"), 5*time.Second)
			require.True(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)
			for _, addr := range []string{excl.Addr(host), excl.Addr("127.0.0.1")} {
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

// TestPortZeroAvoidsHeld: no bind to port 0 and no connection's source
// port is given a held port, of either kind.
func TestPortZeroAvoidsHeld(t *testing.T) {
	held := map[int]bool{}
	for i := range 64 {
		held[hold(t, "127.0.0.1", i%2 == 1).Port] = true
	}
	require.Len(t, held, 64)
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	for range 256 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		require.False(t, held[port], "port 0 gave %d, which is held", port)
		c, err := net.DialTimeout("tcp", srv.Addr().String(), 5*time.Second)
		require.NoError(t, err)
		port = c.LocalAddr().(*net.TCPAddr).Port
		require.NoError(t, c.Close())
		require.False(t, held[port], "a connection's source port %d is held", port)
	}
}

// TestTakeNamesABadHost: a host that is not an IP address is an error
// naming it, and holds nothing.
func TestTakeNamesABadHost(t *testing.T) {
	_, err := Take("localhost", true)
	require.ErrorContains(t, err, `"localhost"`)
}
