package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runBenchCLI runs `kvstream bench ...` through a root of its own, so that
// the tests do not depend on main.go registering the command.
func runBenchCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "kvstream", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(newBench())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"bench"}, args...))
	err := root.Execute()
	return out.String(), err
}

// benchJSON runs the command with --json and decodes its one object.
func benchJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	out, err := runBenchCLI(t, append(args, "--json")...)
	require.NoError(t, err, out)
	var rep map[string]any
	dec := json.NewDecoder(bytes.NewReader([]byte(out)))
	require.NoError(t, dec.Decode(&rep), out)
	assert.False(t, dec.More(), "one object: %s", out)
	return rep
}

func TestBenchTransportLoopbackText(t *testing.T) {
	out, err := runBenchCLI(t, "transport", "--size", "64K", "--count", "32", "--window", "4")
	require.NoError(t, err, out)
	assert.Regexp(t, regexp.MustCompile(`^loopback: 32 × 64 KiB puts, window 4 × 1 write, allocated pools: [0-9.]+ GB/s \([0-9]+ MiB/s\) in [0-9.]+ s; 64 KiB verified\n$`), out)

	out, err = runBenchCLI(t, "transport", "--size", "4KiB", "--count", "10", "--memcpy", "--repeat", "3", "--writes-per-batch", "2", "--pool", "registered")
	require.NoError(t, err, out)
	assert.Regexp(t, regexp.MustCompile(`^loopback: 10 × 4 KiB puts, window 64 × 2 writes, registered pools: .* \(median of 3, .*\); memcpy .*; ratio [0-9.]+; 4 KiB verified\n$`), out)
}

func TestBenchTransportLoopbackJSON(t *testing.T) {
	// 37 writes in batches of 4 (the last one short), each into its own
	// slot: every byte of the 37 × 4 KiB is checked after every run.
	rep := benchJSON(t, "transport", "--transport", "loopback", "--size", "4K", "--count", "37", "--slots", "37",
		"--window", "3", "--writes-per-batch", "4", "--repeat", "3", "--memcpy")
	assert.Equal(t, "loopback", rep["transport"])
	assert.Equal(t, "allocated", rep["pool"])
	assert.NotContains(t, rep, "ucx_tls")
	assert.NotContains(t, rep, "perftest")
	for k, want := range map[string]float64{"size": 4096, "count": 37, "window": 3, "writes_per_batch": 4, "slots": 37,
		"warmup": 37, "repeat": 3, "bytes": 37 * 4096, "verified_bytes": 37 * 4096} {
		assert.Equal(t, want, rep[k], k)
	}
	for _, k := range []string{"seconds", "bytes_per_second", "bytes_per_second_min", "bytes_per_second_max",
		"memcpy_seconds", "memcpy_bytes_per_second", "ratio_to_memcpy", "cpus"} {
		v, ok := rep[k].(float64)
		require.True(t, ok, "%s missing or not a number", k)
		assert.Positive(t, v, k)
	}
	assert.LessOrEqual(t, rep["bytes_per_second_min"], rep["bytes_per_second"])
	assert.LessOrEqual(t, rep["bytes_per_second"], rep["bytes_per_second_max"])
	assert.InDelta(t, rep["bytes"].(float64)/rep["seconds"].(float64), rep["bytes_per_second"], 1)
	runs, ok := rep["runs"].([]any)
	require.True(t, ok)
	assert.Len(t, runs, 3)
	// The default warm-up repeats its run for half a second.
	assert.GreaterOrEqual(t, rep["warmup_seconds"], 0.5)
	assert.GreaterOrEqual(t, rep["warmup_runs"], float64(1))

	// Without --memcpy the memcpy fields are absent, not zero.
	rep = benchJSON(t, "transport", "--size", "1M", "--count", "3", "--warmup-for", "0")
	assert.Equal(t, float64(1), rep["warmup_runs"], "--warmup-for 0: one warm-up run")
	assert.NotContains(t, rep, "memcpy_bytes_per_second")
	assert.NotContains(t, rep, "ratio_to_memcpy")
	assert.Equal(t, float64(1<<20), rep["verified_bytes"])
}

func TestBenchBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--size", "0"}, `invalid argument "0" for "--size" flag: size "0": must be positive`},
		{[]string{"--size", "0K"}, `size "0K": must be positive`},
		{[]string{"--size", "12X"}, `size "12X": unknown suffix "X"`},
		{[]string{"--size", "-1"}, `size "-1": want a number of bytes`},
		{[]string{"--size", "K"}, `size "K": want a number of bytes`},
		{[]string{"--size", "99999999999999999999"}, `size "99999999999999999999": value out of range`},
		{[]string{"--size", "20000000000G"}, `size "20000000000G": too large`},
		{[]string{"--size", "2G"}, "--size 2 GiB: at most 1 GiB"},
		{[]string{"--count", "0"}, "--count 0: must be positive"},
		{[]string{"--count", "-5"}, "--count -5: must be positive"},
		{[]string{"--count", "ten"}, `invalid argument "ten" for "--count" flag`},
		{[]string{"--window", "0"}, "--window 0: must be positive"},
		{[]string{"--window", "100000"}, "--window 100000: at most 65536"},
		{[]string{"--writes-per-batch", "0"}, "--writes-per-batch 0: must be positive"},
		{[]string{"--slots", "0"}, "--slots 0: must be positive"},
		{[]string{"--repeat", "0"}, "--repeat 0: must be positive"},
		{[]string{"--warmup", "-1"}, "--warmup -1: must not be negative"},
		{[]string{"--timeout", "0s"}, "--timeout 0s: must be positive"},
		{[]string{"--warmup-for", "-1s"}, "--warmup-for -1s: must not be negative"},
		{[]string{"--warmup-for", "10m"}, "--warmup-for 10m0s: must be shorter than --timeout 5m0s"},
		{[]string{"--warmup-for", "soon"}, `invalid argument "soon" for "--warmup-for" flag`},
		{[]string{"--ucx-writes", "both"}, `--ucx-writes "both": want messages or rma`},
		{[]string{"--size", "1G", "--count", "20000000000"}, "more bytes than fit in 64 bits"},
		{[]string{"--size", "1M", "--count", "10000", "--slots", "5000"}, "--slots 5000 × --size 1 MiB = 5000 MiB per region: at most 4 GiB"},
		{[]string{"--transport", "carrier-pigeon"}, `--transport "carrier-pigeon": this binary has loopback`},
		{[]string{"--pool", "pinned"}, `--pool "pinned": want auto, allocated or registered`},
		{[]string{"--perftest"}, `--perftest: ucx_perftest measures UCX; use it with --transport ucx, not "loopback"`},
		{[]string{"extra"}, `unknown command "extra"`},
	} {
		out, err := runBenchCLI(t, append([]string{"transport"}, tc.args...)...)
		require.Error(t, err, "%v: %s", tc.args, out)
		assert.Contains(t, err.Error(), tc.want, "%v", tc.args)
	}
}

// TestBenchTransportUCXMissing is the error of a binary built without the
// ucx tag; with the tag, bench_ucx_test.go runs the real thing.
func TestBenchTransportUCXMissing(t *testing.T) {
	if _, ok := transports["ucx"]; ok {
		t.Skip("built with -tags ucx")
	}
	out, err := runBenchCLI(t, "transport", "--transport", "ucx", "--size", "4K", "--count", "1")
	require.Error(t, err, out)
	assert.Contains(t, err.Error(), `--transport "ucx": this binary has loopback (this binary was built without UCX: go build -tags ucx ./cmd/kvstream`)
}

func TestBenchHost(t *testing.T) {
	rep := benchJSON(t, "host", "--duration", "20ms", "--wakes", "20", "--idle", "50us")
	stalls := rep["stalls"].(map[string]any)
	require.GreaterOrEqual(t, stalls["duration_ms"].(float64), 20.0)
	require.InDelta(t, 5.0, stalls["threshold_us"].(float64), 0)
	wake := rep["wake"].(map[string]any)
	require.InDelta(t, 20.0, wake["n"].(float64), 0)
	require.InDelta(t, 50.0, wake["idle_us"].(float64), 0)
	for _, k := range []string{"send_us", "latency_us"} {
		d := wake[k].(map[string]any)
		require.LessOrEqual(t, d["p50"].(float64), d["max"].(float64), k)
	}

	out, err := runBenchCLI(t, "host", "--duration", "10ms", "--wakes", "5", "--idle", "20us")
	require.NoError(t, err, out)
	require.Regexp(t, regexp.MustCompile(`(?m)^stalls: .* of a busy thread's time .*\nwake:   send p50 .* \(5 hand-offs, each after 20 µs idle\)$`), out)
}

func TestBenchHostBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "0s"}, "--duration 0s: must be positive"},
		{[]string{"--threshold", "-1us"}, "--threshold -1µs: must be positive"},
		{[]string{"--wakes", "0"}, "--wakes 0: must be 1 to 1000000"},
		{[]string{"--wakes", "1000001"}, "--wakes 1000001: must be 1 to 1000000"},
		{[]string{"--idle", "0s"}, "--idle 0s: must be positive"},
		// Unbounded, a typo held a CPU (or the terminal) for years.
		{[]string{"--duration", "100000h"}, "--duration 100000h0m0s: must be positive and at most 10m0s"},
		{[]string{"--idle", "100000h"}, "--idle 100000h0m0s: must be positive and at most 1s"},
		{[]string{"--wakes", "1000000", "--idle", "1s"}, "--wakes 1000000 x --idle 1s: the wake probe would sleep 277h46m40s, above the bound of 10m0s"},
	} {
		_, err := runBenchCLI(t, append([]string{"host"}, tc.args...)...)
		require.ErrorContains(t, err, tc.want, tc.args)
	}
}
