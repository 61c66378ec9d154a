package workload

import (
	"context"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp/reshard"
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

// The sharded run's check catches what a wrong engine does, at Finish: two
// GQA prefill engines told each other's TP rank send their heads as the
// other's; MLA ranks that disagree on which replica sends leave decode ranks
// empty. (An engine with a sharding refuses the early-send plant of
// TestOracleCatchesEarlySends itself: its buffers must be the stage's
// layers, one latent each.)
func TestShardedOracle(t *testing.T) {
	gqa := func() Config {
		cfg := oracleConfig()
		cfg.Preset = Presets["llama70b"]
		cfg.Layers = 4
		cfg.PromptTokens, cfg.ChunkTokens, cfg.LayerUsPerKTok = 256, 256, 1000
		cfg.PrefillTP, cfg.DecodeTP = 2, 4
		return cfg
	}
	swap := func(r int, c *system.Config) {
		if r < 2 {
			s := *c.Sharding
			s.Rank.TP = 1 - r
			c.Sharding = &s
		}
	}
	for _, tc := range []struct {
		name string
		cfg  func() Config
		want []string // empty: bytes equal
	}{
		{"GQA TP 2->4 passes", gqa, nil},
		{"GQA TP 2->4 with ranks swapped", func() Config { c := gqa(); c.plantShard = swap; return c }, []string{"per-layer: decode TP rank", "buffer K0"}},
		// Rank 1 told to leave every copy to replica 0 while rank 0 sends
		// only the even decode ranks' (the default rule): the odd ones get
		// nothing.
		{"MLA TP 2->4 with the ranks disagreeing on the replica rule", func() Config {
			c := oracleConfig()
			c.PrefillTP, c.DecodeTP = 2, 4
			c.plantShard = func(r int, ec *system.Config) {
				if r == 1 {
					ec.Replicas = reshard.FirstReplica
				}
			}
			return c
		}, []string{"per-layer: decode TP rank 1", "buffer KV0", "at Finish SUCCESS", "zeros (never written)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Run(context.Background(), tc.cfg(), nil)
			require.NoError(t, err)
			if len(tc.want) == 0 {
				assert.True(t, rep.BytesEqual, rep.Mismatch)
				return
			}
			assert.False(t, rep.BytesEqual)
			for _, w := range tc.want {
				assert.Contains(t, rep.Mismatch, w)
			}
			t.Log(rep.Mismatch)
		})
	}
}
