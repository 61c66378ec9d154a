package tests

import (
	"context"
	"errors" // the standard library's: every error of the packages answers it
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClientClosedMidTransferLeavesNoPeer: a prefill's decode.Client closed
// while its room is mid-transfer (an error path of the serving stack) ends
// the session; the engine keeps the decode peer only until the room ends,
// refusing new rooms toward it meanwhile, and then forgets it, so that the
// next session with the same decode server (the same peer id) attaches and
// is served. Before, the peer stayed for good (said at WARN) and every
// later session's Attach was refused: "peer already added".
func TestClientClosedMidTransferLeavesNoPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pe := newPairEngine(t, 10*time.Second)
	srv, dst, eng := pe.srv, pe.dst, pe.eng
	dial := func() *decode.Client { return pe.dial(ctx, t) }
	spec := func(sess *decode.Client, room uint64, dst []int) system.ChunkSpec {
		return system.ChunkSpec{Room: room, Start: 0, End: 32, Last: true, SrcPages: []int{0, 1}, TotalPages: 2,
			Infos: []system.DecodeInfo{{Peer: sess.Peer().ID, DstPages: dst}}}
	}

	first := dial()
	_, err := eng.Register(ctx, spec(first, 1, dst))
	require.NoError(t, err)
	fw, err := eng.BeginForward()
	require.NoError(t, err)
	require.NoError(t, fw.LayerEnd(0)) // group 0 posted
	require.NoError(t, first.Close(ctx), "the session ends with its room in flight")

	_, err = eng.Register(ctx, spec(first, 2, []int{3, 4}))
	require.Error(t, err, "no new room toward the ended session")
	assert.True(t, errors.Is(err, system.ErrPeerLost), "%v", err)
	assert.ErrorContains(t, err, "is being removed (its session ended)")

	require.NoError(t, fw.LayerEnd(1))
	require.NoError(t, fw.End())
	res, err := eng.Finish(ctx, 1)
	t.Logf("the room of the closed session: %v, %v", res.Status, err)
	require.False(t, errors.Is(err, system.ErrTimeout), "the room ended within its finish timeout: %v", err)

	// The room ended, and its peer with it: the same decode server's next
	// session is added under the same id and served.
	require.NoError(t, srv.Expect(3, []int{6, 7}))
	second := dial()
	require.Equal(t, first.Peer().ID, second.Peer().ID, "the same decode server, the same peer id")
	_, err = eng.Register(ctx, spec(second, 3, []int{6, 7}))
	require.NoError(t, err)
	fw, err = eng.BeginForward()
	require.NoError(t, err)
	require.NoError(t, fw.LayerEnd(0))
	require.NoError(t, fw.LayerEnd(1))
	require.NoError(t, fw.End())
	res, err = eng.Finish(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, system.Succeeded, res.Status)
	_, err = second.Bye(ctx, nil)
	require.NoError(t, err)
}
