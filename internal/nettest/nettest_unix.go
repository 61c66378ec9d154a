//go:build unix

package nettest

import (
	"syscall"
	"testing"
)

// hold binds a TCP socket to a free port of 127.0.0.1, never listening,
// until the test ends, and returns its address.
func hold(t testing.TB, reuse bool) string {
	t.Helper()
	// Close-on-exec before any fork can see the descriptor: the tests
	// start the CLI's processes, which must not inherit it.
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatalf("nettest: socket: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if reuse {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			t.Fatalf("nettest: SO_REUSEADDR: %v", err)
		}
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("nettest: bind 127.0.0.1:0: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("nettest: getsockname: %v", err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("nettest: bound to %T, not an IPv4 address", sa)
	}
	return loopbackAddr(in.Port)
}
