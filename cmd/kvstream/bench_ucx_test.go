//go:build ucx

package main

import (
	"os/exec"
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

			assert.Equal(t, "allocated", rep["pool"], "ucx allocates: auto takes its pools")

			out, err := runBenchCLI(t, "transport", "--transport", "ucx", "--size", "1M", "--count", "4", "--pool", "registered")
			require.NoError(t, err, out)
			assert.Contains(t, out, "ucx (UCX_TLS="+fab.tls+"): 4 × 1 MiB puts, window 64 × 1 write, registered pools")
		})
	}
}

// TestBenchTransportPerftest runs ucx_perftest beside the transport, as
// --perftest does, with both kinds of buffers.
func TestBenchTransportPerftest(t *testing.T) {
	if _, err := exec.LookPath("ucx_perftest"); err != nil {
		t.Skip("ucx_perftest is not installed (package ucx-utils)")
	}
	t.Setenv("UCX_TLS", "tcp")
	rep := benchJSON(t, "transport", "--transport", "ucx", "--size", "64K", "--count", "64", "--perftest", "--repeat", "2")
	pt, ok := rep["perftest"].([]any)
	require.True(t, ok, "perftest missing: %v", rep)
	require.Len(t, pt, 2)
	for i, buffers := range []string{"default", "mmap,heap"} {
		p := pt[i].(map[string]any)
		assert.Equal(t, buffers, p["buffers"])
		for _, k := range []string{"bytes_per_second", "ratio"} {
			v, ok := p[k].(float64)
			require.True(t, ok, "%s: %s missing", buffers, k)
			assert.Positive(t, v, "%s: %s", buffers, k)
		}
		assert.LessOrEqual(t, p["ratio_min"], p["ratio"])
	}
	runs := rep["runs"].([]any)
	require.Len(t, runs, 2)
	for _, r := range runs {
		assert.Len(t, r.(map[string]any)["perftest_bytes_per_second"], 2, "each round ran both")
	}

	_, err := runBenchCLI(t, "transport", "--transport", "ucx", "--size", "64K", "--count", "8", "--perftest", "--perftest-path", "/nonexistent/ucx_perftest")
	require.ErrorContains(t, err, "/nonexistent/ucx_perftest")
}
