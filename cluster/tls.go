package cluster

import (
	"crypto/tls"
	"crypto/x509"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/fileread"
)

// TLSFiles are an etcd client's TLS files, as operators run etcd (its
// --trusted-ca-file, --client-cert-auth): the CA that signed etcd's
// certificate, and this client's certificate and key.
type TLSFiles struct {
	CA, Cert, Key string
}

// Given reports whether any file is named.
func (f TLSFiles) Given() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Config reads the files into a client TLS configuration for
// Config.TLS. The CA alone verifies etcd (a server that asks for no
// client certificate); a certificate needs its key and the other way
// round. Every error names the file it concerns.
func (f TLSFiles) Config() (*tls.Config, error) {
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.Mark(errors.Newf("etcd TLS: certificate %q and key %q go together", f.Cert, f.Key), ErrInvalid)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := readPEM("CA file", f.CA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.Mark(errors.Newf("etcd TLS: CA file %s holds no PEM certificate", f.CA), ErrInvalid)
		}
		c.RootCAs = pool
	}
	if f.Cert != "" {
		certPEM, err := readPEM("certificate file", f.Cert)
		if err != nil {
			return nil, err
		}
		keyPEM, err := readPEM("key file", f.Key)
		if err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, errors.Mark(errors.Wrapf(err, "etcd TLS: certificate %s with key %s", f.Cert, f.Key), ErrInvalid)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// MaxPEMBytes bounds each TLS file Config reads: a CA bundle or a chain is
// a few KiB, and an endless file (/dev/zero as --etcd-ca) is refused at
// the bound instead of read whole.
const MaxPEMBytes = 1 << 20

// readPEM reads path, at most MaxPEMBytes; errors say what the file is,
// its path and the bound, marked ErrInvalid.
func readPEM(what, path string) ([]byte, error) {
	b, err := fileread.Read(path, MaxPEMBytes)
	switch {
	case errors.Is(err, fileread.ErrTooLong):
		return nil, errors.Mark(errors.Newf("etcd TLS: %s %s: longer than the bound of %d MiB for a PEM file", what, path, MaxPEMBytes>>20), ErrInvalid)
	case err != nil:
		return nil, errors.Mark(errors.Wrapf(err, "etcd TLS: %s", what), ErrInvalid)
	}
	return b, nil
}
