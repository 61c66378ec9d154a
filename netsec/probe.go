package netsec

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
)

// Classes of a Probe's failure, for callers that branch (retry or not) and
// for errors that say what happened instead of a timeout.
var (
	// ErrUnreachable: nothing listens at the address (connection refused),
	// or nothing answered within the probe's time. Worth retrying: the
	// peer may not be up yet.
	ErrUnreachable = errors.New("unreachable")
	// ErrAuthentication: the two nodes cannot authenticate each other: one
	// speaks TLS and the other does not, a certificate does not chain to
	// the other's CA, or the peer's certificate does not carry the
	// expected name. Not worth retrying.
	ErrAuthentication = errors.New("authentication failed")
	// ErrNotControlPlane: something listens at the address but speaks
	// another protocol (an HTTP server, such as a node's metrics port).
	// Not worth retrying: the address is wrong.
	ErrNotControlPlane = errors.New("not a control-plane server")
)

// probeRead is how long a probe waits, after a TLS handshake, for the
// server's verdict on this node's certificate (TLS 1.3 sends it after the
// client's handshake completed). A server that accepted says nothing.
const probeRead = 300 * time.Millisecond

// Probe connects to addr the way a node of this deployment would and says
// why it could not talk to it, or nil: nothing listening (ErrUnreachable),
// a plaintext server when t is set or a TLS one when it is not, a
// certificate the server does not trust or one that does not carry name,
// or this node's certificate refused (ErrAuthentication). With t, name is
// the certificate name the server must carry ("" skips that check). It
// returns within ctx; the connection is closed before it returns.
func Probe(ctx context.Context, addr string, t *TLS, name string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.Wrapf(err, "address %q", addr)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return errors.Mark(errors.Newf("no connection to %s within the connect timeout", addr), ErrUnreachable)
		}
		return errors.Mark(errors.Wrapf(err, "nothing listening at %s", addr), ErrUnreachable)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if t == nil {
		return probeClear(conn, addr)
	}
	cfg := t.ClientConfig()
	// Verified here rather than by crypto/tls, to tell the failures apart.
	cfg.InsecureSkipVerify = true
	var verr error
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		verr = verifyPeer(raw, t.pool, host, name)
		return verr
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		switch {
		case verr != nil:
			return errors.Mark(errors.Wrapf(verr, "the server at %s", addr), ErrAuthentication)
		case answeredHTTP(err):
			return notControlPlane(addr)
		case isNotTLS(err):
			return errors.Mark(errors.Newf("the server at %s does not speak TLS, and this node does (start both with TLS, or both in the clear on loopback)", addr), ErrAuthentication)
		case ctx.Err() != nil:
			return errors.Mark(errors.Wrapf(err, "no TLS handshake with %s within the connect timeout", addr), ErrUnreachable)
		}
		return errors.Mark(errors.Wrapf(err, "TLS handshake with %s", addr), ErrAuthentication)
	}
	_ = tc.SetReadDeadline(time.Now().Add(probeRead))
	var b [1]byte
	_, err = tc.Read(b[:])
	var ne net.Error
	if err != nil && !(errors.As(err, &ne) && ne.Timeout()) && strings.Contains(err.Error(), "remote error") {
		return errors.Mark(errors.Wrapf(err, "the server at %s refused this node's certificate", addr), ErrAuthentication)
	}
	return nil
}

// probeClear checks that a server a plaintext node dials is not a TLS
// one: it sends a TLS ClientHello, which a TLS server answers and a
// plaintext (h2c) one does not.
func probeClear(conn net.Conn, addr string) error {
	_ = conn.SetDeadline(time.Now().Add(probeRead))
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // a probe: nothing is sent over it
	err := tc.Handshake()
	if answeredHTTP(err) {
		return notControlPlane(addr)
	}
	if err == nil || strings.Contains(err.Error(), "remote error") {
		return errors.Mark(errors.Newf("the server at %s speaks TLS, and this node runs in the clear (give it the deployment's certificates)", addr), ErrAuthentication)
	}
	return nil
}

// isNotTLS reports whether a handshake failed because the server answered
// with something that is not TLS, or hung up on the ClientHello.
// answeredHTTP reports whether a TLS handshake failed because the server
// answered in HTTP/1 (an HTTP server answers the ClientHello with a 400).
func answeredHTTP(err error) bool {
	var rh tls.RecordHeaderError
	return errors.As(err, &rh) && string(rh.RecordHeader[:]) == "HTTP/"
}

func notControlPlane(addr string) error {
	return errors.Mark(errors.Newf("%s answered HTTP, not the control plane: is it a metrics port (--metrics-addr)? Give the control-plane address (--listen, or --advertise)", addr), ErrNotControlPlane)
}

func isNotTLS(err error) bool {
	var rh tls.RecordHeaderError
	return errors.As(err, &rh) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// verifyPeer checks a server's chain against the CA, its host, and its
// name.
func verifyPeer(raw [][]byte, pool *x509.CertPool, host, name string) error {
	if len(raw) == 0 {
		return errors.New("presented no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return errors.Wrap(err, "presented a certificate that does not parse")
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter}); err != nil {
		return errors.Wrap(err, "presented a certificate this node does not trust (another CA, or outside its validity)")
	}
	id := IdentityOf(certs[0])
	if !id.CoversHost(host) {
		return errors.Newf("presented a certificate for %q that does not cover the host %s it is reached at", id.Name(), host)
	}
	if name != "" && !id.Is(name) {
		return errors.Newf("presented a certificate for %q, not %q (the name it is expected to carry)", id.Name(), name)
	}
	return nil
}
