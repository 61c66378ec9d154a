package netsec

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
)

// DevValidity is how long GenerateDevCerts' certificates are valid.
const DevValidity = 365 * 24 * time.Hour

// CA file names that GenerateDevCerts writes in its directory; a node's
// files are NODE.pem and NODE.key.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca.key"
)

var nodeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// hostLabel is one label of an RFC 1123 host name: letters, digits and
// hyphens, 1 to 63 of them, neither first nor last a hyphen.
var hostLabel = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// CheckHost accepts what a certificate may name as a host a peer dials:
// an IP address, or an RFC 1123 host name (labels of letters, digits and
// hyphens, at most 63 bytes each and 253 in all, the last not all digits,
// which would be a malformed IP address such as 999.1.1.1). A port, a
// space, a wildcard or an empty name is refused, naming the value: it
// would be written into the certificate as a DNS name no peer can dial.
func CheckHost(h string) error {
	if net.ParseIP(h) != nil {
		return nil
	}
	bad := func() error {
		return errors.Newf("host %.80q: want an IP address or a host name (labels of letters, digits and '-', at most 63 bytes each, 253 in all; no port, space or wildcard)", h)
	}
	if h == "" || len(h) > 253 {
		return bad()
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if !hostLabel.MatchString(l) {
			return bad()
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return bad()
	}
	return nil
}

// GenerateDevCerts writes a development CA and one certificate per node
// into dir (created if missing), all ECDSA P-256, and returns each node's
// Files. Every node certificate has the node's name as its subject CN,
// serves as both server and client (each node dials and accepts), and
// names 127.0.0.1, ::1, localhost and every entry of hosts (IP addresses or
// DNS names) so that a peer dialling any of them verifies it. It never
// overwrites a file: an existing one is an error naming it, found before
// anything is written, and a run that fails removes what it wrote, so that
// it writes the CA and every node's files or none of them (a partial run
// left a ca.pem that failed every rerun). Production deployments should
// use certificates from their own CA instead; the CA key written here
// signs anything.
func GenerateDevCerts(dir string, nodes, hosts []string) (_ map[string]Files, err error) {
	if len(nodes) == 0 {
		return nil, errors.New("certs: no node names")
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		if !nodeName.MatchString(n) || n == "ca" {
			return nil, errors.Newf("certs: node name %q: want 1-63 letters, digits, '.', '_' or '-', not \"ca\"", n)
		}
		if seen[n] {
			return nil, errors.Newf("certs: node name %q given twice", n)
		}
		seen[n] = true
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	dns := []string{"localhost"}
	for _, h := range hosts {
		if err := CheckHost(h); err != nil {
			return nil, errors.Wrap(err, "certs")
		}
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	// Every file this run writes, checked before any is.
	caPath := filepath.Join(dir, CAFile)
	targets := []string{caPath, filepath.Join(dir, CAKeyFile)}
	for _, n := range nodes {
		targets = append(targets, filepath.Join(dir, n+".pem"), filepath.Join(dir, n+".key"))
	}
	for _, p := range targets {
		switch _, err := os.Lstat(p); {
		case err == nil:
			return nil, errors.Wrapf(os.ErrExist, "certs: nothing written: %s", p)
		case !errors.Is(err, os.ErrNotExist):
			return nil, errors.Wrapf(err, "certs: %s", p)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errors.Wrap(err, "certs: directory")
	}
	// A file created since the check, or a failed write, ends the run
	// with nothing of it left.
	var written []string
	defer func() {
		if err != nil {
			for _, p := range written {
				_ = os.Remove(p)
			}
		}
	}()
	wrote := func(path string, err error) error {
		if err == nil {
			written = append(written, path)
		}
		return err
	}

	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, errors.Wrap(err, "certs: CA key")
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "kvstream development CA"},
		NotBefore:             now.Add(-time.Hour), // tolerate clock skew between hosts
		NotAfter:              now.Add(DevValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, caCert, err := sign(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, errors.Wrap(err, "certs: CA certificate")
	}
	if err := wrote(caPath, writePEM(caPath, "CERTIFICATE", caDER, 0o644)); err != nil {
		return nil, err
	}
	if err := wrote(filepath.Join(dir, CAKeyFile), writeKey(filepath.Join(dir, CAKeyFile), caKey)); err != nil {
		return nil, err
	}

	out := map[string]Files{}
	for _, n := range nodes {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, errors.Wrapf(err, "certs: key of %s", n)
		}
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: n},
			NotBefore:   now.Add(-time.Hour),
			NotAfter:    now.Add(DevValidity),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    dns,
			IPAddresses: ips,
		}
		der, _, err := sign(tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return nil, errors.Wrapf(err, "certs: certificate of %s", n)
		}
		f := Files{CA: caPath, Cert: filepath.Join(dir, n+".pem"), Key: filepath.Join(dir, n+".key")}
		if err := wrote(f.Cert, writePEM(f.Cert, "CERTIFICATE", der, 0o644)); err != nil {
			return nil, err
		}
		if err := wrote(f.Key, writeKey(f.Key, key)); err != nil {
			return nil, err
		}
		out[n] = f
	}
	return out, nil
}

func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) ([]byte, *x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return der, cert, err
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return errors.Wrapf(err, "certs: %s", path)
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

// writePEM creates path exclusively: regenerating must never silently
// replace a CA that other hosts already trust. A file it created and could
// not write whole it removes.
func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return errors.Wrapf(err, "certs: %s", path)
	}
	err = pem.Encode(f, &pem.Block{Type: kind, Bytes: der})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return errors.Wrapf(err, "certs: %s", path)
	}
	return nil
}
