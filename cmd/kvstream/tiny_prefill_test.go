package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTinyPrefillBadFlags: kvstream prefill with a tiny model refuses,
// before it opens anything, the flags of the sim's modeled GPU and link,
// sharding across processes, plants it cannot commit there and sizes a
// decode process would not check, naming the flag; a sim model refuses
// the tiny models' flags.
func TestTinyPrefillBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "tiny-gqa", "--layers", "4", "--link-gbps", "10"}, "--model tiny-gqa runs on CPU streams over a real link and takes no --layers, --link-gbps"},
		{[]string{"--model", "tiny-mla", "--prefill-tp", "2"}, "--prefill-tp 2 --decode-tp 1 --prefill-pp 1 --decode-pp 1: a tiny model runs unsharded across processes"},
		{[]string{"--model", "tiny-gqa", "--plant", "heads-swapped"}, "plant heads-swapped: not across processes"},
		{[]string{"--model", "tiny-gqa", "--plant", "typo"}, `--plant "typo": want one of none`},
		{[]string{"--model", "tiny-gqa", "--requests", "65"}, "--requests 65: must be within [1, 64]"},
		{[]string{"--model", "tiny-gqa", "--prompt-tokens", "4096"}, "--prompt-tokens 4096: a decode process checks at most 2048"},
		{[]string{"--model", "tiny-gqa", "--new-tokens", "300"}, "--new-tokens 300: a decode process decodes at most 256"},
		{[]string{"--model", "tiny-gqa", "--chunk-tokens", "8"}, "--chunk-tokens 8: must be within [--page-size 16"},
		{[]string{"--model", "tiny-gqa", "--page-order", "diagonal"}, `--page-order "diagonal"`},
		{[]string{"--model", "small", "--new-tokens", "4"}, "--new-tokens applies to the tiny models (--model tiny-gqa, tiny-mla)"},
		{[]string{"--model", "small", "--plant", "rope-offset"}, "--plant applies to the tiny models"},
		{[]string{"--model", "tiny-gqa", "--metrics-addr", "127.0.0.1:0"}, `--metrics-addr: not with the tiny model "tiny-gqa"`},
		{[]string{"--model", "small", "--link-gbps", "10"}, "--link-gbps 10: prefill runs on real time over a real link"},
		{[]string{"--model", "small", "--time-scale", "2"}, "--time-scale 2: prefill runs on real time"},
	} {
		out, err := run(t, append([]string{"prefill", "--decode", "127.0.0.1:1", "--connect-timeout", "0"}, tc.args...)...)
		require.Error(t, err, "%v: %s", tc.args, out)
		assert.True(t, strings.Contains(err.Error(), tc.want), "%v: %v", tc.args, err)
	}
}
