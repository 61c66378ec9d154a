//go:build ucx

package main

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinyRun is a short chunked run of a tiny model: 3 chunks of 32 tokens,
// the last page partial, 8 new tokens per room.
var tinyRun = []string{"--prompt-tokens", "90", "--chunk-tokens", "32", "--page-size", "8", "--new-tokens", "8", "--seed", "2"}

// TestTinyTokensTwoProcess: a tiny model's prefill in one process streams
// each room's KV per layer group over UCX into a decode process, which
// decodes every room's tokens from its pool and finds the model's own:
// tiny-gqa over TCP (two rooms), tiny-mla (its hookless layer too) over
// shared memory.
func TestTinyTokensTwoProcess(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		model, tls string
		requests   string
	}{
		{"tiny-gqa", "tcp", "2"},
		{"tiny-mla", "sm,self", "1"},
	} {
		t.Run(tc.model, func(t *testing.T) {
			env := []string{"UCX_TLS=" + tc.tls}
			dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m")
			addr := dec.waitLine(t, listening, 30*time.Second)[1]
			pre := startCLI(t, env, append([]string{"prefill", "--decode", addr, "--model", tc.model, "--requests", tc.requests}, tinyRun...)...)
			require.NoError(t, pre.wait(t, 2*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
			require.NoError(t, dec.wait(t, time.Minute), "decode:\n%s\n%s", dec.out(), dec.errOut())
			assert.Regexp(t, `prefill: `+tc.model+` per-layer over ucx, `+tc.requests+` requests of 90 prompt tokens in chunks of 32, page 8, K = 2, CP 1: `+
				`\d+ chunks \(0 failed\), .* tokens_equal: true`, pre.out())
			assert.Regexp(t, `prefill: room 1: first token \d+ \(margin [0-9.e-]+\), the model's \d+; the decode process decoded the model's 8 tokens`, pre.out())
			room := regexp.MustCompile(`decode: room (\d) of \S+ \(` + tc.model + `\): tokens_equal: true, 8 tokens after the model's first token \d+, min_top1_margin: ([0-9.e-]+), max_logit_diff: 0`)
			rooms := room.FindAllStringSubmatch(dec.out(), -1)
			require.Len(t, rooms, map[string]int{"1": 1, "2": 2}[tc.requests], "decode:\n%s", dec.out())
			for _, r := range rooms {
				margin, err := strconv.ParseFloat(r[2], 64)
				require.NoError(t, err)
				assert.Greater(t, margin, 10*tinylm.LogitTolerance, "room %s: a pick this close to a tie makes equality luck", r[1])
			}
			assert.Regexp(t, `decode: served 1 sessions \(1 complete\): \d+ chunks \(0 not successful\), `+tc.requests+` rooms complete; tokens: `+
				tc.requests+` rooms checked, `+tc.requests+` equal, min_top1_margin [0-9.e-]+, max_logit_diff 0, tokens_equal: true`, dec.out())
		})
	}
}

// TestTokensPlantedAcrossProcesses: a prefill that leaves the hookless
// layer's KV unsent (every byte it sends is right) gets its room failed
// by the decode process's tokens: both processes say tokens_equal: false
// and exit non-zero.
func TestTokensPlantedAcrossProcesses(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	pre := startCLI(t, env, append([]string{"prefill", "--decode", addr, "--model", "tiny-mla", "--plant", "hookless-not-sent"}, tinyRun...)...)
	require.Error(t, pre.wait(t, 2*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	require.Error(t, dec.wait(t, time.Minute), "decode:\n%s\n%s", dec.out(), dec.errOut())
	assert.Contains(t, pre.out(), "planted bug: hookless-not-sent")
	assert.Contains(t, pre.out(), "tokens_equal: false")
	assert.Contains(t, pre.out(), "verify: room 1: tokens_equal: false: the decode from the transferred KV differs from the model")
	assert.Regexp(t, `decode: room 1 of \S+ \(tiny-mla\): tokens_equal: false, 8 tokens after the model's first token \d+, .*; step \d+ decoded \d+, the model \d+`, dec.out())
	assert.Regexp(t, `decode: served 1 sessions \(1 failed\): \d+ chunks \(1 not successful\), 0 rooms complete; tokens: 1 rooms checked, 0 equal, .*tokens_equal: false`, dec.out())
}
