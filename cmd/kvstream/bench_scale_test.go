package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBenchScaleFrom prints and plots a saved report (the committed
// docs/scale.json): the table has every row, the slopes are fitted, and the
// plot is an SVG with a panel per axis.
func TestBenchScaleFrom(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "scale.svg")
	out, err := runBenchCLI(t, "scale", "--from", "../../docs/scale.json", "--plot", svg)
	require.NoError(t, err, out)
	require.Contains(t, out, "fragmentation     64")
	require.Contains(t, out, "fitted exponent")
	raw, err := os.ReadFile(svg)
	require.NoError(t, err)
	for _, axis := range []string{"rooms", "destinations", "layers", "fragmentation"} {
		require.Contains(t, string(raw), ">"+axis+" (log-log")
	}

	rep := benchJSON(t, "scale", "--from", "../../docs/scale.json")
	require.Len(t, rep["rows"], 21)
	require.NotEmpty(t, rep["slopes"])
}

// TestBenchScaleFlags names the bad value.
func TestBenchScaleFlags(t *testing.T) {
	_, err := runBenchCLI(t, "scale", "--from", filepath.Join(t.TempDir(), "none.json"))
	require.ErrorContains(t, err, "--from ")
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"rows": []}`), 0o600))
	_, err = runBenchCLI(t, "scale", "--from", bad)
	require.ErrorContains(t, err, "no rows")
	_, err = runBenchCLI(t, "scale", "--quick", "--sim-runs", "0")
	require.ErrorContains(t, err, "sim runs 0: must be 1 to 99")
	_, err = runBenchCLI(t, "scale", "--quick", "--axis", "dests")
	require.ErrorContains(t, err, `--axis: scale bench: axis "dests": want rooms, destinations, layers or fragmentation`)
	for _, budget := range []string{"100000h", "11s", "0s", "-1s"} {
		_, err = runBenchCLI(t, "scale", "--quick", "--budget", budget)
		require.ErrorContains(t, err, "--budget ", budget)
		require.ErrorContains(t, err, "must be positive and at most 10s", budget)
	}
}

// TestBenchScaleFromRefusesBadReports: --from reads at most 4 MiB (an
// endless file, /dev/zero, once grew the process past 3.7 GB) and refuses
// a row of an unknown axis or a value below 1 (both were printed), naming
// the file, the row and the field; nothing is printed or plotted.
func TestBenchScaleFromRefusesBadReports(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	row := `{"axis": "rooms", "value": 4}`
	long := write("long.json", `{"rows": [`+row+`]}`+strings.Repeat(" ", 4<<20))
	for _, tc := range []struct {
		path, want string
	}{
		{long, "--from " + long + ": longer than the bound of 4 MiB"}, // before an endless file
		{"/dev/zero", "--from /dev/zero: longer than the bound of 4 MiB"},
		{write("axis.json", `{"rows": [`+row+`, {"axis": "bogus", "value": 4}]}`), `axis.json: row 2: axis "bogus": want rooms, destinations, layers, fragmentation`},
		{write("value.json", `{"rows": [{"axis": "layers", "value": -4}]}`), "value.json: row 1 (layers): value -4: must be at least 1"},
		{write("zero.json", `{"rows": [`+row+`, `+row+`, {"axis": "rooms", "value": 0}]}`), "zero.json: row 3 (rooms): value 0: must be at least 1"},
	} {
		svg := filepath.Join(dir, "plot.svg")
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		out, err := runBenchCLI(t, "scale", "--from", tc.path, "--plot", svg)
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		require.Error(t, err, tc.path)
		require.Contains(t, err.Error(), tc.want)
		assert.Empty(t, out, "nothing printed")
		assert.NoFileExists(t, svg, "nothing plotted")
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "read within the bound")
	}
	// A report of one valid row still reads.
	out, err := runBenchCLI(t, "scale", "--from", write("one.json", `{"rows": [`+row+`]}`))
	require.NoError(t, err)
	assert.Contains(t, out, "rooms      4")
}
