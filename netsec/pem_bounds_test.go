package netsec

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// padTo writes src's bytes followed by newlines to a file of n bytes.
func padTo(t *testing.T, src string, n int) string {
	t.Helper()
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.Less(t, len(b), n)
	p := filepath.Join(t.TempDir(), filepath.Base(src))
	require.NoError(t, os.WriteFile(p, append(b, []byte(strings.Repeat("\n", n-len(b)))...), 0o600))
	return p
}

// TestLoadTLSReadsWithinABound: each of the CA, the certificate and the
// key is read through a limit of MaxPEMBytes; a longer file, or an endless
// one (/dev/zero as all three grew kvstream decode past 4.2 GB), is
// refused naming the file and the bound, before the rest is read. A file
// of exactly the bound still loads.
func TestLoadTLSReadsWithinABound(t *testing.T) {
	files, err := GenerateDevCerts(filepath.Join(t.TempDir(), "c"), []string{"n"}, nil)
	require.NoError(t, err)
	f := files["n"]
	over := func(p string) string { return padTo(t, p, MaxPEMBytes+1) }
	for _, tc := range []struct {
		files Files
		want  string
	}{
		// Finite files first: without the bound, an endless one is read
		// until memory runs out.
		{Files{CA: over(f.CA), Cert: f.Cert, Key: f.Key}, "tls: CA file "},
		{Files{CA: f.CA, Cert: over(f.Cert), Key: f.Key}, "tls: certificate file "},
		{Files{CA: f.CA, Cert: f.Cert, Key: over(f.Key)}, "tls: key file "},
		{Files{CA: "/dev/zero", Cert: "/dev/zero", Key: "/dev/zero"}, "tls: CA file /dev/zero: longer than the bound of 1 MiB for a PEM file"},
		{Files{CA: f.CA, Cert: "/dev/zero", Key: f.Key}, "tls: certificate file /dev/zero: longer than the bound of 1 MiB"},
		{Files{CA: f.CA, Cert: f.Cert, Key: "/dev/zero"}, "tls: key file /dev/zero: longer than the bound of 1 MiB"},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := LoadTLS(tc.files)
		runtime.ReadMemStats(&after)
		require.Error(t, err, "%+v", tc.files)
		assert.Contains(t, err.Error(), tc.want)
		assert.Contains(t, err.Error(), "longer than the bound of 1 MiB for a PEM file")
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "read within the bound")
	}
	_, err = LoadTLS(Files{CA: padTo(t, f.CA, MaxPEMBytes), Cert: padTo(t, f.Cert, MaxPEMBytes), Key: padTo(t, f.Key, MaxPEMBytes)})
	require.NoError(t, err, "a file of exactly the bound loads")
}
