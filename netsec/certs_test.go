package netsec

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func parseCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	blk, _ := pem.Decode(b)
	require.NotNil(t, blk, "%s holds no PEM block", path)
	c, err := x509.ParseCertificate(blk.Bytes)
	require.NoError(t, err)
	return c
}

// A node certificate verifies against the CA, for both roles, under every
// name a peer may dial; its key is private to its owner.
func TestGenerateDevCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	files, err := GenerateDevCerts(dir, []string{"decode", "prefill"}, []string{"10.0.0.7", "decode.example"})
	require.NoError(t, err)
	require.Len(t, files, 2)

	pool := x509.NewCertPool()
	pool.AddCert(parseCert(t, filepath.Join(dir, CAFile)))
	for name, f := range files {
		c := parseCert(t, f.Cert)
		require.Equal(t, name, c.Subject.CommonName)
		for _, host := range []string{"127.0.0.1", "::1", "localhost", "10.0.0.7", "decode.example"} {
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				_, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}})
				require.NoError(t, err, "%s as %v for %s", name, usage, host)
			}
		}
		require.False(t, IdentityOf(c).CoversHost("10.0.0.8"))
		st, err := os.Stat(f.Key)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), f.Key)
		_, err = LoadTLS(f)
		require.NoError(t, err)
	}
	st, err := os.Stat(filepath.Join(dir, CAKeyFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
}

// Regenerating into the same directory must not replace a CA that hosts
// already trust.
func TestGenerateDevCertsNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	_, err := GenerateDevCerts(dir, []string{"decode"}, nil)
	require.NoError(t, err)
	before, err := os.ReadFile(filepath.Join(dir, CAFile))
	require.NoError(t, err)
	_, err = GenerateDevCerts(dir, []string{"decode"}, nil)
	require.ErrorContains(t, err, CAFile)
	after, err := os.ReadFile(filepath.Join(dir, CAFile))
	require.NoError(t, err)
	require.Equal(t, before, after)
}

// A node's existing file fails the run before anything is written: the
// CA and the earlier nodes' files were written first, and a rerun then
// failed on ca.pem.
func TestGenerateDevCertsWritesAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "prefill.pem")
	require.NoError(t, os.WriteFile(existing, []byte("mine"), 0o644))
	_, err := GenerateDevCerts(dir, []string{"decode", "prefill"}, nil)
	require.ErrorContains(t, err, existing)
	require.ErrorIs(t, err, os.ErrExist)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"prefill.pem"}, names, "a failed run left files")
	b, err := os.ReadFile(existing)
	require.NoError(t, err)
	require.Equal(t, "mine", string(b))

	// Once the file is out of the way, the rerun writes everything.
	require.NoError(t, os.Remove(existing))
	files, err := GenerateDevCerts(dir, []string{"decode", "prefill"}, nil)
	require.NoError(t, err)
	require.Len(t, files, 2)
}

func TestGenerateDevCertsRefusesBadInput(t *testing.T) {
	for name, tc := range map[string]struct {
		nodes, hosts []string
		want         string
	}{
		"no nodes":        {nil, nil, "no node names"},
		"path in a name":  {[]string{"../x"}, nil, `"../x"`},
		"empty name":      {[]string{""}, nil, `""`},
		"the CA's name":   {[]string{"ca"}, nil, `"ca"`},
		"duplicate name":  {[]string{"a", "a"}, nil, "twice"},
		"empty host name": {[]string{"a"}, []string{""}, `host ""`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := GenerateDevCerts(dir, tc.nodes, tc.hosts)
			require.ErrorContains(t, err, tc.want)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Empty(t, entries, "bad input wrote files")
		})
	}
}

func TestLoadTLSErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	files, err := GenerateDevCerts(dir, []string{"n"}, nil)
	require.NoError(t, err)
	f := files["n"]

	_, err = LoadTLS(Files{CA: f.CA, Cert: f.Cert})
	require.ErrorContains(t, err, "must all be given")
	missing := filepath.Join(dir, "missing.pem")
	_, err = LoadTLS(Files{CA: missing, Cert: f.Cert, Key: f.Key})
	require.ErrorContains(t, err, missing)
	_, err = LoadTLS(Files{CA: f.Key, Cert: f.Cert, Key: f.Key}) // a key is no certificate
	require.ErrorContains(t, err, f.Key)
	_, err = LoadTLS(Files{CA: f.CA, Cert: f.Cert, Key: f.CA})
	require.ErrorContains(t, err, f.CA)
}

// writeNodeCert writes a node certificate signed by the CA in dir (as
// GenerateDevCerts wrote it) valid over [from, to), and returns its Files.
func writeNodeCert(t *testing.T, dir, name string, from, to time.Time) Files {
	t.Helper()
	caCert := parseCert(t, filepath.Join(dir, CAFile))
	b, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	require.NoError(t, err)
	blk, _ := pem.Decode(b)
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	require.NoError(t, err)
	caKey := k.(*ecdsa.PrivateKey)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, NotBefore: from, NotAfter: to,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, _, err := sign(tmpl, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	f := Files{CA: filepath.Join(dir, CAFile), Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+".key")}
	require.NoError(t, writePEM(f.Cert, "CERTIFICATE", der, 0o644))
	require.NoError(t, writeKey(f.Key, key))
	return f
}

// TestLoadTLSTellsNotYetValidFromExpired: a certificate whose validity
// starts later is reported as not valid yet (with the instant and this
// host's clock), one whose validity ended as expired; the TLS handshake
// would call both "expired".
func TestLoadTLSTellsNotYetValidFromExpired(t *testing.T) {
	dir := t.TempDir()
	_, err := GenerateDevCerts(dir, []string{"ok"}, nil)
	require.NoError(t, err)
	now := time.Now()

	early := writeNodeCert(t, dir, "early", now.Add(2*time.Hour), now.Add(48*time.Hour))
	_, err = LoadTLS(early)
	require.ErrorIs(t, err, ErrNotYetValid)
	require.NotErrorIs(t, err, ErrExpired)
	require.ErrorContains(t, err, `"early" is not valid yet: valid from `)
	require.ErrorContains(t, err, early.Cert)
	require.NotContains(t, err.Error(), "expire")

	late := writeNodeCert(t, dir, "late", now.Add(-48*time.Hour), now.Add(-time.Hour))
	_, err = LoadTLS(late)
	require.ErrorIs(t, err, ErrExpired)
	require.ErrorContains(t, err, `"late" expired at `)

	fine := writeNodeCert(t, dir, "fine", now.Add(-time.Minute), now.Add(time.Hour))
	_, err = LoadTLS(fine)
	require.NoError(t, err)

	// The oracle itself: the x509 check the handshake runs does not tell
	// the two apart, which is why LoadTLS checks first.
	pool := x509.NewCertPool()
	pool.AddCert(parseCert(t, early.CA))
	_, verr := parseCert(t, early.Cert).Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	require.ErrorContains(t, verr, "expired or is not yet valid")
}
