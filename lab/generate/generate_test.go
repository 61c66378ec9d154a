package generate

import (
	"context"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// small is a configuration sized for tests: 40 prompt tokens in chunks of
// 16 (three forwards, the last partial), pages of 4 tokens, 6 new tokens.
func small(model string) Config {
	c := Defaults()
	c.Model = tinylm.Presets[model]
	c.PromptTokens, c.ChunkTokens, c.PageSize, c.NewTokens = 40, 16, 4, 6
	c.Monolithic = false
	return c
}

func run(t *testing.T, c Config) *Report {
	t.Helper()
	rep, err := Run(context.Background(), c, nil)
	require.NoError(t, err)
	return rep
}

// requireEqual checks a correct run: tokens equal everywhere, bytes equal,
// a margin far above the tolerance.
func requireEqual(t *testing.T, rep *Report) {
	t.Helper()
	var b strings.Builder
	rep.Text(&b)
	require.True(t, rep.BytesEqual, b.String())
	require.True(t, rep.TokensEqual, b.String())
	require.True(t, rep.TransportOK, b.String())
	assert.Empty(t, rep.PerLayer.Transport)
	assert.Equal(t, rep.ModelTokens, rep.Tokens, b.String())
	assert.Equal(t, rep.ModelTokens, rep.ReferenceTokens, b.String())
	assert.Len(t, rep.Tokens, rep.NewTokens)
	assert.LessOrEqual(t, rep.MaxLogitDiff, tinylm.LogitTolerance)
	assert.Greater(t, rep.MinTop1Margin, 10*tinylm.LogitTolerance, "a pick this close to a tie makes equality luck")
	assert.Positive(t, rep.PerLayer.Bytes)
}

// TestGenerateMatrix: the transfer must give the decode the tokens the
// model generates on its own, across both models, chunked prefill, CP,
// different TP sizes on each side, PP and both page orders.
func TestGenerateMatrix(t *testing.T) {
	type tc struct {
		name  string
		model string
		edit  func(*Config)
	}
	cases := []tc{
		{"GQA chunked both modes", "tiny-gqa", func(c *Config) { c.Monolithic = true }},
		{"MLA chunked both modes", "tiny-mla", func(c *Config) { c.Monolithic = true }},
		{"GQA CP 2", "tiny-gqa", func(c *Config) { c.CP = 2 }},
		{"MLA CP 2 contiguous", "tiny-mla", func(c *Config) { c.CP, c.CPRule = 2, cp.Contiguous }},
		{"GQA TP 2 to 4", "tiny-gqa", func(c *Config) { c.PrefillTP, c.DecodeTP = 2, 4 }},
		{"GQA TP 4 to 2 token-major", "tiny-gqa", func(c *Config) { c.PrefillTP, c.DecodeTP, c.PageOrder = 4, 2, reshard.TokenMajor }},
		{"MLA TP 2 to 4", "tiny-mla", func(c *Config) { c.PrefillTP, c.DecodeTP = 2, 4 }},
		{"MLA TP 4 to 2", "tiny-mla", func(c *Config) { c.PrefillTP, c.DecodeTP = 4, 2 }},
		{"GQA PP 2 to 1", "tiny-gqa", func(c *Config) { c.PrefillPP = 2 }},
		{"MLA PP 2 to 1", "tiny-mla", func(c *Config) { c.PrefillPP = 2 }},
		{"GQA TP 8 to 2 PP 1 to 2", "tiny-gqa", func(c *Config) { c.PrefillTP, c.DecodeTP, c.DecodePP = 8, 2, 2 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := small(c.model)
			c.edit(&cfg)
			rep := run(t, cfg)
			requireEqual(t, rep)
			if cfg.Monolithic {
				require.NotNil(t, rep.Monolithic)
				assert.True(t, rep.Monolithic.TokensEqual)
				assert.Equal(t, rep.Tokens, rep.Monolithic.Tokens)
				assert.Equal(t, rep.PerLayer.Bytes, rep.Monolithic.Bytes, "both modes send the same bytes")
			}
		})
	}
}

// TestPlantedBugsChangeTokens commits, one at a time, the production bugs
// the engine exists to prevent, and requires the decode's tokens to differ
// from the model's. The byte oracle catches each bug whose bytes differ;
// the RoPE offset it cannot: the prefill computed wrong KV and the
// transfer delivered exactly those bytes, so only tokens (against the
// model on its own) show it, and the collocated reference, decoding the
// same wrong KV, agrees with the decode.
func TestPlantedBugsChangeTokens(t *testing.T) {
	for _, tc := range []struct {
		plant        Plant
		model        string
		edit         func(*Config)
		bytesCatch   bool
		mismatchHas  string
		refAgreesBug bool // the collocated reference shares the bug
	}{
		{plant: PlantChunkPositions, model: "tiny-gqa", bytesCatch: true, mismatchHas: "layer 0 K"},
		{plant: PlantRoPEOffset, model: "tiny-gqa", bytesCatch: false, refAgreesBug: true},
		{plant: PlantRoPEOffset, model: "tiny-mla", bytesCatch: false, refAgreesBug: true},
		{plant: PlantHeadsSwapped, model: "tiny-gqa", edit: func(c *Config) { c.PrefillTP, c.DecodeTP = 2, 4 }, bytesCatch: true, mismatchHas: "TP rank 0"},
		{plant: PlantStalePage, model: "tiny-gqa", bytesCatch: true, mismatchHas: "request page 0 "},
		{plant: PlantStalePage, model: "tiny-mla", edit: func(c *Config) { c.CP = 2 }, bytesCatch: true, mismatchHas: "request page 0 "},
		{plant: PlantHooklessNotSent, model: "tiny-mla", bytesCatch: true, mismatchHas: "layer 5 latent"},
	} {
		t.Run(tc.plant.String()+" "+tc.model, func(t *testing.T) {
			cfg := small(tc.model)
			cfg.Plant = tc.plant
			if tc.edit != nil {
				tc.edit(&cfg)
			}
			rep := run(t, cfg)
			var b strings.Builder
			rep.Text(&b)
			assert.False(t, rep.TokensEqual, b.String())
			assert.NotEqual(t, rep.ModelTokens, rep.Tokens, "the decode's tokens must differ from the model's:\n%s", b.String())
			assert.Equal(t, !tc.bytesCatch, rep.BytesEqual, b.String())
			if tc.bytesCatch {
				assert.Contains(t, rep.PerLayer.Mismatch, tc.mismatchHas)
				assert.False(t, rep.PerLayer.TokensEqual, "the decode must differ from the collocated reference:\n%s", b.String())
			}
			if tc.refAgreesBug {
				assert.Equal(t, rep.ReferenceTokens, rep.Tokens, "the transfer itself is right:\n%s", b.String())
				assert.NotEqual(t, rep.ModelTokens, rep.ReferenceTokens)
			}
		})
	}
}

// TestPlantTPReplicasSend: every TP replica of the MLA latent sends (the
// audit's planted bug). Bytes and tokens are right, so only the ledger of
// the transport oracle shows it: twice the bytes posted, on every chunk
// (the ledger's arithmetic is checked by hand in lab/landguard).
func TestPlantTPReplicasSend(t *testing.T) {
	cfg := small("tiny-mla")
	cfg.PrefillTP = 2
	honest := run(t, cfg)
	requireEqual(t, honest)

	cfg.Plant = PlantTPReplicasSend
	rep := run(t, cfg)
	var b strings.Builder
	rep.Text(&b)
	assert.True(t, rep.BytesEqual, b.String())
	assert.True(t, rep.TokensEqual, b.String())
	assert.False(t, rep.TransportOK, b.String())
	assert.False(t, rep.OK())
	assert.Equal(t, 2*honest.PerLayer.Bytes, rep.PerLayer.Bytes)
	require.Len(t, rep.PerLayer.Transport, 3, "one violation per chunk (40 tokens in chunks of 16)")
	for _, v := range rep.PerLayer.Transport {
		assert.Contains(t, v, "decode rank 0")
		assert.Contains(t, v, "every byte 2 times")
	}
	assert.Contains(t, b.String(), "transport_ok: false")
}

// TestPlantsAreRefusedWhereTheyShowNothing: a plant the configuration
// cannot exhibit is an error, never a silent pass.
func TestPlantsAreRefusedWhereTheyShowNothing(t *testing.T) {
	for _, tc := range []struct {
		plant Plant
		edit  func(*Config)
		want  string
	}{
		{PlantChunkPositions, func(c *Config) { c.ChunkTokens = 64 }, "needs two chunks"},
		{PlantHeadsSwapped, func(c *Config) {}, "needs --decode-tp 2"},
		{PlantHeadsSwapped, func(c *Config) { c.Model = tinylm.Presets["tiny-mla"]; c.DecodeTP = 2 }, "hold the same heads"},
		{PlantHooklessNotSent, func(c *Config) {}, "has no layer without a hook"},
		{PlantHooklessNotSent, func(c *Config) { c.Model = tinylm.Presets["tiny-mla"]; c.DecodeTP = 2 }, "needs TP 1 and PP 1"},
		{PlantTPReplicasSend, func(c *Config) { c.Model = tinylm.Presets["tiny-mla"] }, "needs --prefill-tp 2"},
		{PlantTPReplicasSend, func(c *Config) { c.PrefillTP = 2 }, "hold different heads"},
	} {
		cfg := small("tiny-gqa")
		cfg.Plant = tc.plant
		tc.edit(&cfg)
		_, err := Run(context.Background(), cfg, nil)
		require.Error(t, err, "%s", tc.plant)
		assert.Contains(t, err.Error(), tc.want)
		assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	}
}
