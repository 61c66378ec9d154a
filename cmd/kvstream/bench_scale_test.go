package main

import (
	"os"
	"path/filepath"
	"testing"

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
}
