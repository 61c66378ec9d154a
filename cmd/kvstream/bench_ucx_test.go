//go:build ucx

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// benchFabrics are the UCX_TLS settings the UCX bench runs under: TCP
// through the loopback interface, and shared memory, as hw/rdma/ucx's own
// tests do.
var benchFabrics = []struct{ name, tls string }{{"tcp", "tcp"}, {"shm", "sm,self"}}

func TestBenchTransportUCX(t *testing.T) {
	for _, fab := range benchFabrics {
		t.Run(fab.name, func(t *testing.T) {
			// The ucx transport reads UCX_TLS when it is created: the
			// command passes the environment through untouched.
			t.Setenv("UCX_TLS", fab.tls)
			rep := benchJSON(t, "transport", "--transport", "ucx", "--size", "64K", "--count", "24", "--slots", "24",
				"--window", "4", "--writes-per-batch", "2", "--repeat", "2")
			assert.Equal(t, "ucx", rep["transport"])
			assert.Equal(t, fab.tls, rep["ucx_tls"])
			assert.Equal(t, float64(24*64<<10), rep["verified_bytes"])
			for _, k := range []string{"seconds", "bytes_per_second"} {
				v, ok := rep[k].(float64)
				require.True(t, ok, "%s missing or not a number", k)
				assert.Positive(t, v, k)
			}

			out, err := runBenchCLI(t, "transport", "--transport", "ucx", "--size", "1M", "--count", "4")
			require.NoError(t, err, out)
			assert.Contains(t, out, "ucx (UCX_TLS="+fab.tls+"): 4 × 1 MiB puts")
		})
	}
}
