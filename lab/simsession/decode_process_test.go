package simsession

import (
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestDecodeProcessServerOptions: what kvstream decode's flags set in a
// DecodeProcessConfig reaches every server's decode.Config.
func TestDecodeProcessServerOptions(t *testing.T) {
	obs, err := decode.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	cfg := DecodeProcessConfig{MaxRoomsPerSession: 16, MaxChunksPerRoom: 32, TracePath: "trace.jsonl"}
	var got decode.Config
	for _, o := range cfg.serverOptions(obs) {
		o(&got)
	}
	require.Equal(t, 16, got.MaxRoomsPerSession)
	require.Equal(t, 32, got.MaxChunksPerRoom)
	require.Equal(t, "trace.jsonl", got.TracePath)
	require.Equal(t, decode.Observer(obs), got.Observer)

	var def decode.Config
	for _, o := range (DecodeProcessConfig{}).serverOptions(obs) {
		o(&def)
	}
	require.Zero(t, def.MaxRoomsPerSession, "0: decode's default")
	require.Zero(t, def.MaxChunksPerRoom)
	require.Empty(t, def.TracePath)
}
