package netsec

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/fileread"
)

// Files names the PEM files of one node: the CA that signs every node of
// the deployment, and this node's certificate and private key.
type Files struct {
	CA, Cert, Key string
}

// TLS is one node's mutual-TLS material: its certificate, presented both as
// a server and as a client (protoactor remote dials its peers as well as
// accepting them), and the CA pool that every peer's certificate must chain
// to.
type TLS struct {
	cert tls.Certificate
	pool *x509.CertPool
}

// LoadTLS reads a node's CA, certificate and key. Every error names the
// file it concerns.
func LoadTLS(f Files) (*TLS, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, errors.Newf("tls: CA %q, certificate %q and key %q must all be given", f.CA, f.Cert, f.Key)
	}
	caPEM, err := ReadPEMFile("CA file", f.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.Newf("tls: CA file %s holds no PEM certificate", f.CA)
	}
	certPEM, err := ReadPEMFile("certificate file", f.Cert)
	if err != nil {
		return nil, err
	}
	keyPEM, err := ReadPEMFile("key file", f.Key)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, errors.Wrapf(err, "tls: certificate %s with key %s", f.Cert, f.Key)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, errors.Wrapf(err, "tls: certificate %s", f.Cert)
	}
	if err := CheckValidity(leaf, time.Now()); err != nil {
		return nil, errors.Wrapf(err, "tls: certificate %s", f.Cert)
	}
	for rest := caPEM; len(rest) > 0; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if ca, err := x509.ParseCertificate(blk.Bytes); err == nil {
			if err := CheckValidity(ca, time.Now()); err != nil {
				return nil, errors.Wrapf(err, "tls: CA file %s", f.CA)
			}
		}
	}
	return &TLS{cert: cert, pool: pool}, nil
}

// MaxPEMBytes bounds each PEM file LoadTLS reads: a CA bundle or a chain
// is a few KiB, and an endless file (/dev/zero as --tls-ca once grew the
// process past 4.2 GB) is refused at the bound instead of read whole.
const MaxPEMBytes = 1 << 20

// ReadPEMFile reads path, at most MaxPEMBytes; errors say what the file
// is ("CA file", "certificate file", "key file"), its path and the bound.
func ReadPEMFile(what, path string) ([]byte, error) {
	b, err := fileread.Read(path, MaxPEMBytes)
	switch {
	case errors.Is(err, fileread.ErrTooLong):
		return nil, errors.Newf("tls: %s %s: longer than the bound of %d MiB for a PEM file", what, path, MaxPEMBytes>>20)
	case err != nil:
		return nil, errors.Wrapf(err, "tls: %s", what)
	}
	return b, nil
}

// Errors of CheckValidity, for errors.Is.
var (
	// ErrNotYetValid is a certificate whose validity starts later.
	ErrNotYetValid = errors.New("not valid yet")
	// ErrExpired is a certificate whose validity ended.
	ErrExpired = errors.New("expired")
)

// CheckValidity says whether c is valid at now, telling a certificate
// that is not valid yet (a clock behind the CA's, or one issued for later)
// from one that expired. The TLS handshake cannot: x509 reports both as
// "expired or is not yet valid", and the alert a peer receives says
// "expired certificate" either way. LoadTLS checks a node's own
// certificate and its CA with it, so that neither reaches a handshake.
func CheckValidity(c *x509.Certificate, now time.Time) error {
	name := c.Subject.CommonName
	if name == "" {
		name = "(no CN)"
	}
	switch {
	case now.Before(c.NotBefore):
		return errors.Wrapf(ErrNotYetValid, "%q is not valid yet: valid from %s, %s from now (this host's clock is %s; is it behind the CA's?)",
			name, c.NotBefore.UTC().Format(time.RFC3339), c.NotBefore.Sub(now).Round(time.Second), now.UTC().Format(time.RFC3339))
	case now.After(c.NotAfter):
		return errors.Wrapf(ErrExpired, "%q expired at %s, %s ago (this host's clock is %s)",
			name, c.NotAfter.UTC().Format(time.RFC3339), now.Sub(c.NotAfter).Round(time.Second), now.UTC().Format(time.RFC3339))
	}
	return nil
}

// ServerConfig accepts only TLS 1.3 clients that present a certificate
// chaining to the CA: an unauthenticated peer never reaches a gRPC handler.
func (t *TLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		ClientCAs:    t.pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

// ClientConfig dials only TLS 1.3 servers whose certificate chains to the
// CA and names the dialled host (gRPC sets the server name from the
// address it dials), and presents this node's certificate.
func (t *TLS) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		RootCAs:      t.pool,
	}
}
