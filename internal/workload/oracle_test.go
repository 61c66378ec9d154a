package workload

import (
	"context"
	"testing"
	"time"

	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// oracleConfig is one forward of one request on the small preset (8 hook
// layers and the MTP layer, buffers KV0..KV8), with layers long enough (50
// ms each) that an early read happens well inside the writing kernel.
func oracleConfig() Config {
	cfg := Defaults()
	cfg.Preset = Presets["small"]
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens = 1, 1024, 1024
	cfg.LayerUsPerKTok = 50000 / 1.024
	cfg.GroupSize = 4
	cfg.Submitters = 2
	return cfg
}

func TestOracleAcceptsTheEngine(t *testing.T) {
	rep, err := Run(context.Background(), oracleConfig(), nil)
	require.NoError(t, err)
	assert.True(t, rep.BytesEqual, rep.Mismatch)
}

// A planted mistake must make the byte check fail, naming room, page and
// buffer: the oracle is only worth what it catches.
func TestOracleCatchesEarlySends(t *testing.T) {
	for _, tc := range []struct {
		name   string
		plant  func([]system.Buffer)
		buffer string
	}{
		// The MTP buffer (layer 8, no hook) sent with the last group, when
		// layer 7 ends: its kernel still has 50 ms to run.
		{"hookless with the last group", func(b []system.Buffer) { b[8].Layer = 7 }, "buffer KV8"},
		// KV5 (group 1) sent with group 0, two layers before its kernel.
		{"a buffer one group early", func(b []system.Buffer) { b[5].Layer = 1 }, "buffer KV5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := oracleConfig()
			cfg.plant = tc.plant
			start := time.Now()
			rep, err := Run(context.Background(), cfg, nil)
			require.NoError(t, err)
			assert.False(t, rep.BytesEqual)
			assert.Contains(t, rep.Mismatch, "per-layer: room 0")
			assert.Contains(t, rep.Mismatch, "decode page")
			assert.Contains(t, rep.Mismatch, tc.buffer)
			assert.Contains(t, rep.Mismatch, "at Finish SUCCESS")
			t.Logf("%s (%v)", rep.Mismatch, time.Since(start))
		})
	}
}
