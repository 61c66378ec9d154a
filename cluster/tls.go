package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"os"

	"github.com/cockroachdb/errors"
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
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, errors.Mark(errors.Wrap(err, "etcd TLS: CA file"), ErrInvalid)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.Mark(errors.Newf("etcd TLS: CA file %s holds no PEM certificate", f.CA), ErrInvalid)
		}
		c.RootCAs = pool
	}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, errors.Mark(errors.Wrapf(err, "etcd TLS: certificate %s with key %s", f.Cert, f.Key), ErrInvalid)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
