package launch

import (
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/stretchr/testify/require"
)

// TestDecodeInstanceServerOptions: the session bounds reach the server's
// decode.Config, and zero leaves decode's defaults to it.
func TestDecodeInstanceServerOptions(t *testing.T) {
	var got decode.Config
	for _, o := range (DecodeInstanceConfig{MaxRoomsPerSession: 16, MaxChunksPerRoom: 32}).serverOptions() {
		o(&got)
	}
	require.Equal(t, 16, got.MaxRoomsPerSession)
	require.Equal(t, 32, got.MaxChunksPerRoom)

	var def decode.Config
	for _, o := range (DecodeInstanceConfig{}).serverOptions() {
		o(&def)
	}
	require.Zero(t, def.MaxRoomsPerSession, "0: decode's default")
	require.Zero(t, def.MaxChunksPerRoom)
}
