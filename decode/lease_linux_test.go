//go:build linux

package decode

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/netsec"
	"github.com/stretchr/testify/require"
)

// heldForListener checks that port is held (internal/portlease holds it
// on Linux): a listener without SO_REUSEADDR cannot bind it.
func heldForListener(t *testing.T, port int) {
	t.Helper()
	_, err := listenExclusive(port)
	require.True(t, errors.Is(err, syscall.EADDRINUSE), "port %d is held: %v", port, err)
}

// listenExclusive listens on every interface's port without SO_REUSEADDR
// (which Go's listener sets): it fails while any socket holds the port.
func listenExclusive(port int) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 0)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)))
}

// TestAllInterfacesNodeFreesItsPort: a node on every interface with no
// port chosen listens on a port held for it, and lets go of it: once the
// node closed, the port is free for anyone.
func TestAllInterfacesNodeFreesItsPort(t *testing.T) {
	ip, err := RoutableIP()
	if err != nil {
		t.Skipf("no routable address to advertise: %v", err)
	}
	files, err := netsec.GenerateDevCerts(t.TempDir(), []string{"decode"}, []string{ip.String()})
	require.NoError(t, err)
	tlsm, err := netsec.LoadTLS(files["decode"])
	require.NoError(t, err)
	node, err := ListenConfig(NodeConfig{Listen: "0.0.0.0:0", TLS: tlsm})
	require.NoError(t, err)
	_, portText, err := net.SplitHostPort(node.Addr())
	require.NoError(t, err)
	port, err := strconv.Atoi(portText)
	require.NoError(t, err)
	require.NotZero(t, ownSockets(t, port), "the node listens on port %d", port)
	require.NoError(t, node.Close(context.Background()))
	// This process holds no socket on the port any more. (Not a bind of
	// the port: once it is free, another process's connection may take it
	// as its source port, and the bind then fails for that reason.)
	require.Zero(t, ownSockets(t, port), "port %d is let go once the node closed", port)
}

// ownSockets counts this process's sockets whose local port is port,
// asking each descriptor that is a socket for its address: a socket that
// is only bound (a held port) too, which the kernel's connection tables do
// not list.
func ownSockets(t *testing.T, port int) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range fds {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// A descriptor closed meanwhile (another test's) answers an error
		// and a nil address, which matches no port.
		sa, _ := syscall.Getsockname(fd)
		switch sa := sa.(type) {
		case *syscall.SockaddrInet4:
			if sa.Port == port {
				n++
			}
		case *syscall.SockaddrInet6:
			if sa.Port == port {
				n++
			}
		}
	}
	return n
}
