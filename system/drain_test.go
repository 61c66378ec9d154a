package system_test

import (
	"context"
	"errors" // the standard library's: what a caller without cockroachdb has
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chunkSpec is room's chunk of tokens [from, to) of an 8-token request
// (two pages of 4) toward peer "d".
func chunkSpec(room uint64, from, to int) system.ChunkSpec {
	var src []int
	for p := from / 4; p < (to+3)/4; p++ {
		src = append(src, p)
	}
	return system.ChunkSpec{Room: room, Start: from, End: to, Last: to == 8, SrcPages: src, TotalPages: 2,
		Infos: []system.DecodeInfo{{Peer: "d", DstPages: []int{2, 3}}}}
}

// sendAll runs one forward over what is registered and finishes room.
func sendAll(t *testing.T, e *system.Engine, room uint64) system.Result {
	t.Helper()
	fw, err := e.BeginForward()
	require.NoError(t, err)
	require.NoError(t, fw.LayerEnd(0))
	require.NoError(t, fw.LayerEnd(1))
	require.NoError(t, fw.End())
	res, err := e.Finish(context.Background(), room)
	require.NoError(t, err)
	return res
}

// TestPeerDrainingRefusesNewRoomsOnly: once a decode peer drains, a chunk
// that opens a new room toward it is refused (ErrDecodeDraining, seen by
// the standard library's errors.Is) and changes nothing, while the rooms in
// flight there go on to their last chunk; the serving stack hears of the
// drain once.
func TestPeerDrainingRefusesNewRoomsOnly(t *testing.T) {
	type drain struct{ peer, reason string }
	var mu sync.Mutex
	var heard []drain
	e := stdEngine(t, sim.NoFault, 5*time.Second, system.WithPeerDraining(func(peer, reason string) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, drain{peer, reason})
	}))
	ctx := context.Background()

	// Room 1's first chunk goes out before the drain.
	_, err := e.Register(ctx, chunkSpec(1, 0, 4))
	require.NoError(t, err)
	assert.Equal(t, system.Succeeded, sendAll(t, e, 1).Status)

	require.NoError(t, e.PeerDraining("d", "decode stopping"))
	require.NoError(t, e.PeerDraining("d", "again"), "a second call changes nothing")
	mu.Lock()
	assert.Equal(t, []drain{{"d", "decode stopping"}}, heard)
	mu.Unlock()
	assert.True(t, errors.Is(e.PeerDraining("nobody", "x"), system.ErrBadInput), "an unknown peer")

	// A new room is refused, and nothing is registered for it.
	_, err = e.Register(ctx, chunkSpec(2, 0, 8))
	require.Error(t, err)
	assert.True(t, errors.Is(err, system.ErrDecodeDraining), "%v", err)
	assert.Contains(t, err.Error(), `decode peer "d" is draining (decode stopping)`)
	assert.False(t, e.HasRoom(2))

	// Room 1, in flight, is registered, sent and finished to its end.
	_, err = e.Register(ctx, chunkSpec(1, 4, 8))
	require.NoError(t, err)
	res := sendAll(t, e, 1)
	assert.Equal(t, system.Succeeded, res.Status)
	assert.NoError(t, res.Err)
}
