//go:build linux

package decode

import (
	"context"
	"net"
	"strconv"
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
	require.NoError(t, node.Close(context.Background()))
	l, err := listenExclusive(port)
	require.NoError(t, err, "port %d is free once the node closed", port)
	require.NoError(t, l.Close())
}
