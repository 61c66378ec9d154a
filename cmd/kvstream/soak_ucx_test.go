//go:build ucx

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvstream/kvstream/lab/soak"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSoakUCX runs the soak's short form over UCX's tcp transport, as its
// own process (this binary as kvstream soak, whose decode, prefills and
// vanish helper are this binary too): every kind of fault at least once
// (each lane runs every kind of the mix once before it draws by weight),
// and the report must find nothing: no decode crash, no legitimate session
// failed or with bytes that differ, no bye-writer write completed after
// its Bye, every fault answered as it must be, the decode's memory, files
// and goroutines within the default bounds, a clean drain at the end.
func TestSoakUCX(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := startCLI(t, []string{"UCX_TLS=tcp"}, "soak", "--episodes", "6", "--for", "5m", "--json",
		"--mix", "clean=2,kill=1,stop=1,pause-decode=1,vanish=1,refused=1,bye-writer=1")
	err := c.wait(t, 4*time.Minute)
	t.Logf("the soak took %v", time.Since(start).Round(time.Second))
	var rep soak.Report
	require.NoError(t, json.Unmarshal([]byte(c.out()), &rep), "stdout:\n%s\nstderr:\n%s", c.out(), c.errOut())
	require.NoError(t, err, "report: %v\nnotes:\n%s\nstderr:\n%s", rep.Failures, strings.Join(rep.Notes, "\n"), c.errOut())
	assert.True(t, rep.OK, "%v\nnotes: %v", rep.Failures, rep.Notes)
	assert.Equal(t, "tcp", rep.UCXTLS)
	assert.Equal(t, 6, rep.Episodes)
	assert.Zero(t, rep.DecodeCrashes, rep.Crash)
	assert.Zero(t, rep.Corrupt)
	assert.Zero(t, rep.LegitFailed)
	assert.Zero(t, rep.Misbehaved, "%v", rep.Notes)
	assert.Zero(t, rep.ByeWriter.LandedAfterBye)
	assert.Positive(t, rep.ByeWriter.PostsAfterBye, "the bye-writers posted after their Bye")
	for _, k := range soak.Kinds() {
		if k != soak.Clean {
			assert.Positive(t, rep.Injected[k], "%s injected", k)
		}
	}
	assert.GreaterOrEqual(t, rep.Served[soak.Clean], 2, "the warm-up and a clean episode")
	assert.Equal(t, soak.DefaultBounds, rep.Bounds)
	assert.LessOrEqual(t, rep.RSSMiB.Growth(), rep.Bounds.RSSGrowthMiB)
	assert.LessOrEqual(t, rep.FDs.Growth(), float64(rep.Bounds.FDGrowth))
	assert.LessOrEqual(t, rep.Goroutines.Growth(), float64(rep.Bounds.GoroutineGrowth))
	assert.Positive(t, rep.Samples)
	assert.Equal(t, "exit 0", rep.DecodeExit)
	assert.Positive(t, rep.DecodeSessions["complete"], "the decode's own count of complete sessions")
	assert.Positive(t, rep.DecodeSessions["lost"], "and of lost ones")
}
