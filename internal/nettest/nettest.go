package nettest

import (
	"testing"

	"github.com/kvstream/kvstream/internal/portlease"
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

// hold holds a free port of 127.0.0.1 (portlease) until the test ends.
func hold(t testing.TB, shared bool) string {
	t.Helper()
	l, err := portlease.Take("127.0.0.1", shared)
	if err != nil {
		t.Fatalf("nettest: %v", err)
	}
	t.Cleanup(l.Release)
	return l.Addr("127.0.0.1")
}
