package nettest

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReservedPortRefusesAndStaysTaken: a dial to a reserved address is
// refused, a listen on it fails while it is held, and succeeds once it is
// released.
func TestReservedPortRefusesAndStaysTaken(t *testing.T) {
	addr, release := Reserve(t)
	_, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.Error(t, err)
	require.True(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)

	_, err = net.Listen("tcp", addr)
	require.Error(t, err, "the port is still held")
	require.True(t, errors.Is(err, syscall.EADDRINUSE), "%v", err)

	release()
	release()
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err, "released, the port is free again")
	require.NoError(t, l.Close())
}

// TestPortZeroAvoidsReserved: binds to port 0 never get a held port.
func TestPortZeroAvoidsReserved(t *testing.T) {
	held := map[string]bool{}
	for range 64 {
		held[Refusing(t)] = true
	}
	require.Len(t, held, 64)
	for range 256 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		require.False(t, held[addr], "port 0 gave %s, which is held", addr)
	}
}
