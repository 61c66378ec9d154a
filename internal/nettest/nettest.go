// Package nettest gives tests TCP addresses where nothing listens and
// nothing else can start to.
//
// The usual way, listening on port 0 and closing the listener, frees the
// port at once: a node another test starts on port 0 may be given it, and a
// dial to it may even be given it as its own source port and connect to
// itself. A dial that was to find nothing listening then finds something,
// and the test fails on an answer it did not expect. A socket bound to the
// port, and never listening, keeps the port: the kernel refuses a
// connection to it, gives it to no other bind to port 0, and picks it as no
// connection's source port.
package nettest

import (
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// Reserve binds a TCP socket to a free port of 127.0.0.1 and keeps it
// bound, not listening, until release is called or the test ends: until
// then a connection to addr is refused, and no other socket takes the port.
// Release it just before something is to listen at addr.
func Reserve(t testing.TB) (addr string, release func()) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("nettest: socket: %v", err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = syscall.Close(fd) }) }
	t.Cleanup(release)
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
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in.Port)), release
}

// Refusing is an address of 127.0.0.1 that refuses connections until the
// test ends (Reserve, never released early).
func Refusing(t testing.TB) string {
	t.Helper()
	addr, _ := Reserve(t)
	return addr
}
