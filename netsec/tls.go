package netsec

import (
	"crypto/tls"
	"crypto/x509"
	"os"

	"github.com/cockroachdb/errors"
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
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, errors.Wrapf(err, "tls: CA file")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.Newf("tls: CA file %s holds no PEM certificate", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, errors.Wrapf(err, "tls: certificate %s with key %s", f.Cert, f.Key)
	}
	return &TLS{cert: cert, pool: pool}, nil
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
