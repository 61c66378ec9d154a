package decode

import (
	"testing"

	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/require"
)

// TestMaxChunksPerRoomReplays: a trace header carries the core's chunk
// bound and a replay runs under it; a trace recorded before the bound (no
// max_chunks_per_room) replays under the default.
func TestMaxChunksPerRoomReplays(t *testing.T) {
	r, _, err := replayRules(&trace.DecodeConfig{Server: "d", MaxSessions: 1, MaxRoomsPerSession: 1, MaxPoolBytes: 1, Size: true})
	require.NoError(t, err)
	require.Equal(t, DefaultMaxChunksPerRoom, r.MaxChunksPerRoom, "a header without the bound")
	r.MaxChunksPerRoom = 5
	h := traceConfig("d", r, nil)
	require.Equal(t, 5, h.MaxChunksPerRoom)
	require.NoError(t, h.Validate())
	back, _, err := replayRules(h)
	require.NoError(t, err)
	require.Equal(t, 5, back.MaxChunksPerRoom, "the recorded bound replays")
	h.MaxChunksPerRoom = -1
	require.ErrorContains(t, h.Validate(), "max_chunks_per_room")
}
