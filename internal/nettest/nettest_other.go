//go:build !unix

package nettest

import (
	"net"
	"testing"
)

// hold, where no socket can be held bound without listening from Go's
// standard library, takes a free port and frees it: the port may be given
// to another socket before the test uses it.
func hold(t testing.TB, _ bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("nettest: listen: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}
