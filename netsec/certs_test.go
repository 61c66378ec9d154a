package netsec

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

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
