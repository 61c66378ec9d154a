package workload

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --group auto: the sim and the engine come to the same K (Run checks it),
// the report says which and why, and the bytes are right.
func TestAutoGroup(t *testing.T) {
	cfg := Defaults()
	cfg.Preset = Presets["small"]
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens = 1, 2048, 2048
	cfg.GroupSize, cfg.AutoGroup = 0, true
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	require.NotNil(t, rep.GroupAuto)
	assert.Equal(t, rep.GroupAuto.K, rep.GroupSize)
	assert.Contains(t, rep.GroupAuto.Reason, "K = ")
	assert.True(t, rep.BytesEqual, rep.Mismatch)
	assert.Empty(t, rep.OracleFailures)

	both := cfg
	both.GroupSize = 4
	_, err = Run(context.Background(), both, nil)
	assert.ErrorContains(t, err, "--group 4 and --group auto: give one")

	sharded := cfg
	sharded.PrefillTP = 2
	_, err = Run(context.Background(), sharded, nil)
	assert.ErrorContains(t, err, "not for sharded runs")
}
