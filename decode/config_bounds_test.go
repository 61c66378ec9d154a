package decode_test

import (
	"fmt"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSessionBoundsChecked: New refuses a MaxSessions, MaxRoomsPerSession
// or MaxChunksPerRoom below 0 or above its limit (a trace recording it would
// not replay), naming the field and the value, and takes the limit itself.
func TestSessionBoundsChecked(t *testing.T) {
	tr, bufs, node := newServerParts(t)
	for _, tc := range []struct {
		cfg  decode.Config
		want string
	}{
		{decode.Config{MaxSessions: -1}, "MaxSessions -1: must not be negative"},
		{decode.Config{MaxSessions: decode.MaxSessionsLimit + 1},
			fmt.Sprintf("MaxSessions %d: want 0 (the default, 64) to %d", decode.MaxSessionsLimit+1, decode.MaxSessionsLimit)},
		{decode.Config{MaxRoomsPerSession: -1}, "MaxRoomsPerSession -1: must not be negative"},
		{decode.Config{MaxRoomsPerSession: decode.MaxRoomsPerSessionLimit + 1},
			fmt.Sprintf("MaxRoomsPerSession %d: want 0 (the default, 4096) to %d", decode.MaxRoomsPerSessionLimit+1, decode.MaxRoomsPerSessionLimit)},
		{decode.Config{MaxChunksPerRoom: -1}, "MaxChunksPerRoom -1: must not be negative"},
		{decode.Config{MaxChunksPerRoom: decode.MaxChunksPerRoomLimit + 1},
			fmt.Sprintf("MaxChunksPerRoom %d: want 0 (the default, 8192) to %d", decode.MaxChunksPerRoomLimit+1, decode.MaxChunksPerRoomLimit)},
	} {
		tc.cfg.Buffers = bufs
		_, err := decode.New(node, tr, tc.cfg)
		assert.ErrorIs(t, err, decode.ErrBadInput, tc.want)
		assert.ErrorContains(t, err, tc.want)
	}
	srv, err := decode.New(node, tr, decode.Config{Buffers: bufs, MaxSessions: decode.MaxSessionsLimit, MaxRoomsPerSession: decode.MaxRoomsPerSessionLimit,
		MaxChunksPerRoom: decode.MaxChunksPerRoomLimit})
	require.NoError(t, err)
	require.NoError(t, srv.Close(waitCtx(t)))
}
