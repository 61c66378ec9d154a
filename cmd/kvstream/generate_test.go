package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The defaults are what README shows a newcomer: they must print
// tokens_equal: true.
func TestGenerateDefaults(t *testing.T) {
	out, err := run(t, "generate")
	require.NoError(t, err, out)
	assert.Contains(t, out, "tokens_equal: true")
	assert.Contains(t, out, "bytes_equal: true")
	for _, row := range []string{"tokens (per layer)", "tokens (monolithic)", "reference (collocated)", "model (on its own)",
		"exposed transfer (ms)", "ideal floor (ms)", "max_logit_diff:", "min_top1_margin:"} {
		assert.Contains(t, out, row)
	}
}

var quickGenerate = []string{"generate", "--prompt-tokens", "48", "--chunk-tokens", "16", "--page-size", "4", "--new-tokens", "6"}

func TestGenerateJSON(t *testing.T) {
	out, err := run(t, append(quickGenerate, "--model", "tiny-mla", "--prefill-tp", "2", "--decode-tp", "4", "--cp", "2", "--json")...)
	require.NoError(t, err, out)
	type mode struct {
		TokensEqual bool    `json:"tokens_equal"`
		ExposedMs   float64 `json:"exposed_ms"`
		FloorMs     float64 `json:"floor_ms"`
		ForwardMs   float64 `json:"forward_ms"`
		Bytes       uint64  `json:"bytes"`
	}
	var rep struct {
		TokensEqual     bool    `json:"tokens_equal"`
		BytesEqual      bool    `json:"bytes_equal"`
		Tokens          []int   `json:"tokens"`
		ReferenceTokens []int   `json:"reference_tokens"`
		ModelTokens     []int   `json:"model_tokens"`
		MaxLogitDiff    float64 `json:"max_logit_diff"`
		LogitTolerance  float64 `json:"logit_tolerance"`
		MinTop1Margin   float64 `json:"min_top1_margin"`
		PrefillTP       int     `json:"prefill_tp"`
		DecodeTP        int     `json:"decode_tp"`
		CP              int     `json:"cp"`
		PerLayer        *mode   `json:"per_layer"`
		Monolithic      *mode   `json:"monolithic"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.True(t, rep.TokensEqual)
	assert.True(t, rep.BytesEqual)
	assert.Len(t, rep.Tokens, 6)
	assert.Equal(t, rep.ModelTokens, rep.Tokens)
	assert.Equal(t, rep.ModelTokens, rep.ReferenceTokens)
	assert.LessOrEqual(t, rep.MaxLogitDiff, rep.LogitTolerance)
	assert.Positive(t, rep.LogitTolerance)
	assert.Greater(t, rep.MinTop1Margin, rep.LogitTolerance)
	assert.Equal(t, []int{2, 4, 2}, []int{rep.PrefillTP, rep.DecodeTP, rep.CP})
	require.NotNil(t, rep.PerLayer, out)
	require.NotNil(t, rep.Monolithic, out)
	for _, m := range []*mode{rep.PerLayer, rep.Monolithic} {
		assert.True(t, m.TokensEqual)
		assert.Positive(t, m.FloorMs, "the last group's bytes take time on the link")
		assert.Positive(t, m.ForwardMs)
		assert.Positive(t, m.Bytes)
		assert.GreaterOrEqual(t, m.ExposedMs, 0.0)
	}
	assert.Equal(t, rep.PerLayer.Bytes, rep.Monolithic.Bytes)
}

// A planted bug that bytes cannot see: the command prints bytes_equal:
// true, tokens_equal: false, and exits non-zero.
func TestGeneratePlantedBugFails(t *testing.T) {
	out, err := run(t, append(quickGenerate, "--plant", "rope-offset", "--monolithic=false")...)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tokens differ")
	assert.Contains(t, out, "planted bug: rope-offset")
	assert.Contains(t, out, "bytes_equal: true")
	assert.Contains(t, out, "tokens_equal: false")
}

func TestGenerateBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "llama70b"}, `--model: model "llama70b": want one of tiny-gqa, tiny-mla`},
		{[]string{"--page-order", "diagonal"}, `--page-order "diagonal"`},
		{[]string{"--plant", "typo"}, `--plant "typo": want one of none, chunk-positions`},
		{[]string{"--prefill-tp", "3"}, "--prefill-tp 3 --decode-tp 1"},
		{[]string{"--chunk-tokens", "8"}, "--chunk-tokens 8: must be within [--page-size 16"},
		{[]string{"--prefill-pp", "7"}, "--model tiny-gqa has 6 layers"},
		{[]string{"--link-gbps", "0"}, "--link-gbps 0"},
		{[]string{"--cp-rule", "odd"}, "--cp-rule"},
		{[]string{"--new-tokens", "0"}, "--new-tokens 0"},
	} {
		out, err := run(t, append([]string{"generate"}, tc.args...)...)
		require.Error(t, err, "%v: %s", tc.args, out)
		assert.True(t, strings.Contains(err.Error(), tc.want), "%v: %v", tc.args, err)
		assert.True(t, errors.Is(err, system.ErrBadInput), "%v: %v", tc.args, err)
	}
}
