package netsec

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/nettest"
	"github.com/stretchr/testify/require"
)

// probeServer accepts connections on loopback and hands each to serve,
// until the test ends.
func probeServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			serve(c)
			c.Close()
		}
	}()
	return l.Addr().String()
}

func tlsOf(t *testing.T, files map[string]Files, node string) *TLS {
	t.Helper()
	c, err := LoadTLS(files[node])
	require.NoError(t, err)
	return c
}

// TestProbeSaysWhy: each way a node can fail to talk to another is told
// apart, with its class, instead of a timeout.
func TestProbeSaysWhy(t *testing.T) {
	dir := t.TempDir()
	files, err := GenerateDevCerts(filepath.Join(dir, "a"), []string{"decode", "prefill"}, []string{"127.0.0.1"})
	require.NoError(t, err)
	other, err := GenerateDevCerts(filepath.Join(dir, "b"), []string{"decode", "prefill"}, []string{"127.0.0.1"})
	require.NoError(t, err)
	decodeTLS, prefillTLS := tlsOf(t, files, "decode"), tlsOf(t, files, "prefill")
	// A node that trusts the deployment's CA but holds another CA's
	// certificate: the server refuses it.
	strangerTLS := &TLS{cert: tlsOf(t, other, "prefill").cert, pool: prefillTLS.pool}

	tlsServer := func(c *TLS) string {
		return probeServer(t, func(conn net.Conn) {
			tc := tls.Server(conn, c.ServerConfig())
			if tc.Handshake() == nil {
				_ = tc.SetReadDeadline(time.Now().Add(time.Second))
				_, _ = io.Copy(io.Discard, tc) // the client hangs up after its probe
			}
		})
	}
	// A plaintext (h2c) server reads the ClientHello as a bad preface and
	// hangs up.
	clear := probeServer(t, func(conn net.Conn) {
		var b [64]byte
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = conn.Read(b[:])
	})
	good := tlsServer(decodeTLS)
	nobody := nettest.Refusing(t)

	ctx := func() context.Context {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t.Cleanup(cancel)
		return c
	}
	for _, tc := range []struct {
		name     string
		addr     string
		tls      *TLS
		peer     string
		class    error
		contains string
	}{
		{"nothing listening", nobody, prefillTLS, "decode", ErrUnreachable, "nothing listening at " + nobody},
		{"TLS node, plaintext server", clear, prefillTLS, "decode", ErrAuthentication, "does not speak TLS"},
		{"plaintext node, TLS server", good, nil, "", ErrAuthentication, "speaks TLS, and this node runs in the clear"},
		{"another name", good, prefillTLS, "decode-1", ErrAuthentication, `presented a certificate for "decode", not "decode-1"`},
		{"another CA", tlsServer(tlsOf(t, other, "decode")), prefillTLS, "decode", ErrAuthentication, "does not trust"},
		{"this node refused", good, strangerTLS, "", ErrAuthentication, "refused this node's certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Probe(ctx(), tc.addr, tc.tls, tc.peer)
			require.Error(t, err)
			require.True(t, errors.Is(err, tc.class), "%v", err)
			require.ErrorContains(t, err, tc.contains)
		})
	}
	require.NoError(t, Probe(ctx(), good, prefillTLS, "decode"), "the right peer")
	// A metrics port (an HTTP server) is told apart, in the clear and with
	// TLS alike.
	metrics := httptest.NewServer(http.NotFoundHandler())
	defer metrics.Close()
	maddr := strings.TrimPrefix(metrics.URL, "http://")
	for _, c := range []*TLS{nil, prefillTLS} {
		err := Probe(ctx(), maddr, c, "decode")
		require.True(t, errors.Is(err, ErrNotControlPlane), "%v", err)
		require.ErrorContains(t, err, maddr+" answered HTTP, not the control plane: is it a metrics port (--metrics-addr)?")
	}
	require.NoError(t, Probe(ctx(), clear, nil, ""), "plaintext on both sides")
}
