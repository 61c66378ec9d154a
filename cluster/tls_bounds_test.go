package cluster_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/netsec"
)

// TestTLSFilesReadWithinABound: --etcd-ca, --etcd-cert and --etcd-key are
// read through a limit of cluster.MaxPEMBytes; a longer or endless file
// (/dev/zero) is refused naming the file and the bound, before the rest
// is read. A file of exactly the bound still loads.
func TestTLSFilesReadWithinABound(t *testing.T) {
	dir := t.TempDir()
	files, err := netsec.GenerateDevCerts(filepath.Join(dir, "c"), []string{"client"}, nil)
	require.NoError(t, err)
	f := files["client"]
	pad := func(src string, n int) string {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		p := filepath.Join(t.TempDir(), filepath.Base(src))
		require.NoError(t, os.WriteFile(p, append(b, []byte(strings.Repeat("\n", n-len(b)))...), 0o600))
		return p
	}
	over := cluster.MaxPEMBytes + 1
	for _, tc := range []struct {
		files cluster.TLSFiles
		want  string
	}{
		// Finite files first: without the bound, an endless one is read
		// until memory runs out.
		{cluster.TLSFiles{CA: pad(f.CA, over)}, "etcd TLS: CA file "},
		{cluster.TLSFiles{Cert: pad(f.Cert, over), Key: f.Key}, "etcd TLS: certificate file "},
		{cluster.TLSFiles{Cert: f.Cert, Key: pad(f.Key, over)}, "etcd TLS: key file "},
		{cluster.TLSFiles{CA: "/dev/zero"}, "etcd TLS: CA file /dev/zero: longer than the bound of 1 MiB"},
		{cluster.TLSFiles{Cert: "/dev/zero", Key: "/dev/zero"}, "etcd TLS: certificate file /dev/zero: longer than the bound of 1 MiB"},
		{cluster.TLSFiles{CA: f.CA, Cert: f.Cert, Key: "/dev/zero"}, "etcd TLS: key file /dev/zero: longer than the bound of 1 MiB"},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := tc.files.Config()
		runtime.ReadMemStats(&after)
		require.Error(t, err, "%+v", tc.files)
		assert.Contains(t, err.Error(), tc.want)
		assert.Contains(t, err.Error(), "longer than the bound of 1 MiB for a PEM file")
		assert.True(t, errors.Is(err, cluster.ErrInvalid))
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "read within the bound")
	}
	c, err := cluster.TLSFiles{CA: pad(f.CA, cluster.MaxPEMBytes), Cert: pad(f.Cert, cluster.MaxPEMBytes), Key: pad(f.Key, cluster.MaxPEMBytes)}.Config()
	require.NoError(t, err, "a file of exactly the bound loads")
	assert.Len(t, c.Certificates, 1)
}
