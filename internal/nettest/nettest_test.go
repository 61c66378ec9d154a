//go:build linux

package nettest

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRefusingStaysTaken: a dial to a Refusing address is refused, and a
// listen on it fails while the test runs.
func TestRefusingStaysTaken(t *testing.T) {
	addr := Refusing(t)
	_, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.True(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)
	_, err = net.Listen("tcp", addr)
	require.True(t, errors.Is(err, syscall.EADDRINUSE), "the port is held: %v", err)
}

// TestListenLaterTakesAListener: a ListenLater address refuses dials until
// a listener binds it, which it may while the port is held; then dials
// reach that listener.
func TestListenLaterTakesAListener(t *testing.T) {
	addr := ListenLater(t)
	_, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.True(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err, "a listener binds the held port")
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			_ = c.Close()
		}
		accepted <- err
	}()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, <-accepted)
}
