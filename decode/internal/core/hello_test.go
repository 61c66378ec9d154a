package core

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLayoutBytes: a layout's bytes are checked against the bound with
// every product and sum checked for overflow.
func TestLayoutBytes(t *testing.T) {
	require.NoError(t, layoutBytes([]PrefillBuffer{{ItemLen: 1 << 10, Pages: 1 << 10}}, 1<<20))
	require.Error(t, layoutBytes([]PrefillBuffer{{ItemLen: 1 << 10, Pages: 1<<10 + 1}}, 1<<20))
	require.Error(t, layoutBytes([]PrefillBuffer{{ItemLen: 1 << 63, Pages: 2}}, 1<<64-1))
	require.Error(t, layoutBytes([]PrefillBuffer{{ItemLen: 1 << 63, Pages: 1}, {ItemLen: 1 << 63, Pages: 1}}, 1<<64-1))
}
