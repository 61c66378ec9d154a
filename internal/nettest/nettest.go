// Package nettest gives tests TCP addresses where nothing listens and
// nothing else can start to.
//
// The usual way, listening on port 0 and closing the listener, frees the
// port at once: a node another test (or the process under test) starts on
// port 0 may be given it, and a dial that was to find nothing listening
// finds that node, and the test fails on an answer it did not expect. A
// socket bound to the port, and never listening, keeps the port (on Linux
// and the BSDs): the kernel refuses a connection to it, and gives it to no
// other bind to port 0 and to no connection as its source port.
package nettest

import (
	"net"
	"strconv"
	"testing"
)

// Refusing is an address of 127.0.0.1 that refuses connections until the
// test ends: its port is bound, never listening, and no other socket can
// bind it meanwhile.
func Refusing(t testing.TB) string {
	t.Helper()
	return hold(t, false)
}

// ListenLater is an address of 127.0.0.1 that refuses connections until
// something listens there: its port is bound, never listening, until the
// test ends, with SO_REUSEADDR, so that a listener that sets it too (Go's
// net.Listen does) may bind and listen on it meanwhile, while no bind to
// port 0 is given it. For a test that starts a client before its server.
func ListenLater(t testing.TB) string {
	t.Helper()
	return hold(t, true)
}

func loopbackAddr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
