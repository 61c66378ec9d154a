package workload

import (
	"runtime"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/system"
)

// TestShardDegreesBounded: a TP or PP degree that is negative, or a PP
// with more stages than the model has layers, is refused naming the flag
// and the value, sharded run or not, before anything is sized from it.
// kvstream sim --decode-pp 9223372036854775807 panicked in makeslice,
// --prefill-pp 1000000000000 ran out of memory, --prefill-pp 300000000 took
// 2.4 GB before failing, and --decode-tp -1 ran unsharded and succeeded.
func TestShardDegreesBounded(t *testing.T) {
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, tc := range []struct {
		set  func(c *Config)
		want string
	}{
		{func(c *Config) { c.DecodeTP = -1 }, "--decode-tp -1: must be within [0, 1024]"},
		{func(c *Config) { c.PrefillTP = -3 }, "--prefill-tp -3: must be within [0, 1024]"},
		{func(c *Config) { c.PrefillPP = -1 }, "--prefill-pp -1: must be within [0, 4096]"},
		{func(c *Config) { c.DecodePP = -2 }, "--decode-pp -2: must be within [0, 4096]"},
		{func(c *Config) { c.PrefillTP = 1 << 20 }, "--prefill-tp 1048576: must be within [0, 1024]"},
		{func(c *Config) { c.DecodePP = 9223372036854775807 }, "--decode-pp 9223372036854775807: must be within [0, 4096]"},
		{func(c *Config) { c.PrefillPP = 1000000000000 }, "--prefill-pp 1000000000000: must be within [0, 4096]"},
		{func(c *Config) { c.PrefillPP = 300000000 }, "--prefill-pp 300000000: must be within [0, 4096]"},
		{func(c *Config) { c.PrefillPP = 100000 }, "--prefill-pp 100000: must be within [0, 4096]"},
		// Within the flag's bound, beyond the model's layers.
		{func(c *Config) { c.PrefillPP = 4096 }, "--prefill-pp 4096 (--model small, 9 layers): PP 4096: more stages than the 9 layers"},
		{func(c *Config) { c.DecodePP = 10 }, "--decode-pp 10 (--model small, 9 layers): PP 10: more stages than the 9 layers"},
		{func(c *Config) { c.DecodePP, c.Layers = 20, 16 }, "--decode-pp 20 (--model small, 17 layers)"},
	} {
		c := Defaults()
		c.Preset = Presets["small"]
		tc.set(&c)
		_, err := c.validate()
		require.Error(t, err, tc.want)
		assert.Contains(t, err.Error(), tc.want)
		assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "refusals allocate nothing from the values they refuse")

	// At the bound, one stage per layer: accepted as far as the count goes.
	c := Defaults()
	c.Preset, c.PrefillPP, c.DecodePP = Presets["small"], 2, 9
	_, err := c.validate()
	require.NoError(t, err)
	c.PrefillPP = 9
	_, err = c.validate()
	assert.ErrorContains(t, err, "prefill PP stage 8 holds only layers without a hook")
}
