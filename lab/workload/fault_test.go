package workload

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFault(t *testing.T) {
	f, err := ParseFault("--fault", "endpoint-broken:0.05")
	require.NoError(t, err)
	assert.Equal(t, Fault{Kind: "endpoint-broken", Rate: 0.05}, f)
	assert.Equal(t, "endpoint-broken:0.05", f.String())
	for in, want := range map[string]string{
		"endpoint-broken":       `--fault "endpoint-broken": want KIND:RATE`,
		"flaky:0.1":             `--fault "flaky:0.1": unknown fault "flaky", want one of endpoint-broken`,
		"endpoint-broken:1.5":   `--fault "endpoint-broken:1.5": rate "1.5" must be a probability per batch within [0, 1]`,
		"endpoint-broken:-0.1":  `rate "-0.1" must be a probability`,
		"endpoint-broken:NaN":   `rate "NaN" must be a probability`,
		"endpoint-broken:often": `rate "often" must be a probability`,
	} {
		_, err := ParseFault("--fault", in)
		require.Error(t, err, in)
		assert.Contains(t, err.Error(), want)
		assert.True(t, errors.Is(err, system.ErrBadInput), in)
	}
}

// TestSimResumesBrokenEndpoints: with one batch in twenty torn by a broken
// connection, the default run completes with no chunk failed in either
// mode, every byte equal and the transport oracle satisfied (which counts
// the bytes landed against what the pages need: a torn half re-sent is
// not an excess), and the report counts the faults and the resends.
func TestSimResumesBrokenEndpoints(t *testing.T) {
	cfg := Defaults()
	cfg.Fault = Fault{Kind: "endpoint-broken", Rate: 0.05}
	cfg.Seed = 2 // six faults in the per-layer run
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err, "a chunk failed, or the run stopped")
	assert.True(t, rep.BytesEqual, rep.Mismatch)
	assert.Empty(t, rep.OracleFailures)
	pl := rep.PerLayer
	assert.Zero(t, pl.Failed)
	assert.Zero(t, rep.Monolithic.Failed)
	require.Positive(t, pl.FaultsInjected)
	assert.GreaterOrEqual(t, pl.WorksResent, pl.FaultsInjected, "each torn batch is re-sent (and so is any batch its endpoint's close failed)")
	assert.Positive(t, pl.ChunksResumed)
}
