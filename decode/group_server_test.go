package decode_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// group2 is a CP group of two shared-KV ranks with pages of 4 tokens (the
// notice helper's).
var group2 = &decode.Group{Size: 2, Rule: cp.SharedKV, PageSize: 4}

func (r *rig) dialRank(t *testing.T, rank int) *decode.Client {
	t.Helper()
	c, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4,
		Name: "rank-" + strconv.Itoa(rank), Metadata: map[string]string{decode.RankKey: strconv.Itoa(rank)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// rankNotice is notice filtered to the positions rank owns under group2.
func rankNotice(rank int, room uint64, from, to, base int, last bool, status system.Status) decode.Notice {
	n := notice(room, from, to, base, last, status, nil)
	if status != system.Succeeded {
		n.Result.Err = errors.New("link down")
	}
	var pos, dst []int
	for i, p := range n.Positions {
		if p%2 == rank {
			pos, dst = append(pos, p), append(dst, n.DstPages[i])
		}
	}
	n.Positions, n.DstPages = pos, dst
	return n
}

// TestGroupRoomNeedsEveryOwner: room 7 (8 pages, two chunks) is complete
// only once both ranks reported both chunks; one rank alone is not enough.
func TestGroupRoomNeedsEveryOwner(t *testing.T) {
	r := newRig(t, decode.Config{Group: group2})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7, 8, 9, 10, 11}))
	c0, c1 := r.dialRank(t, 0), r.dialRank(t, 1)
	for _, ch := range [][2]int{{0, 4}, {4, 8}} {
		require.NoError(t, c0.Notify(waitCtx(t), rankNotice(0, 7, ch[0], ch[1], 4, ch[1] == 8, system.Succeeded)))
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := r.srv.Wait(short, 7)
	require.ErrorIs(t, err, context.DeadlineExceeded, "rank 1 has not reported: the room must wait")
	for _, ch := range [][2]int{{4, 8}, {0, 4}} {
		require.NoError(t, c1.Notify(waitCtx(t), rankNotice(1, 7, ch[0], ch[1], 4, ch[1] == 8, system.Succeeded)))
	}
	room, err := r.srv.Wait(waitCtx(t), 7)
	require.NoError(t, err)
	assert.True(t, room.Complete)
	assert.Len(t, room.Chunks, 4)
	for _, c := range []*decode.Client{c0, c1} {
		_, err := c.Bye(waitCtx(t), nil)
		assert.NoError(t, err)
	}
}

// TestGroupRoomFailedRank: a rank that reports its chunk failed fails the
// room, whatever the other rank reported.
func TestGroupRoomFailedRank(t *testing.T) {
	r := newRig(t, decode.Config{Group: group2})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7, 8, 9, 10, 11}))
	c0, c1 := r.dialRank(t, 0), r.dialRank(t, 1)
	require.NoError(t, c0.Notify(waitCtx(t), rankNotice(0, 7, 0, 4, 4, false, system.Succeeded)))
	require.NoError(t, c1.Notify(waitCtx(t), rankNotice(1, 7, 0, 4, 4, false, system.Failed)))
	_, err := r.srv.Wait(waitCtx(t), 7)
	assert.ErrorIs(t, err, decode.ErrChunkFailed)
	assert.Contains(t, err.Error(), "rank 1")
}

// TestGroupRoomForeignRank: a rank reporting pages it does not own fails
// the room.
func TestGroupRoomForeignRank(t *testing.T) {
	r := newRig(t, decode.Config{Group: group2})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7, 8, 9, 10, 11}))
	c1 := r.dialRank(t, 1)
	err := c1.Notify(waitCtx(t), rankNotice(0, 7, 0, 4, 4, false, system.Succeeded))
	assert.ErrorIs(t, err, decode.ErrChunkFailed, "the prefill is told")
	_, err = r.srv.Wait(waitCtx(t), 7)
	assert.ErrorIs(t, err, decode.ErrChunkFailed)
	assert.Contains(t, err.Error(), "rank 1 reported positions [0 2], it owns [1 3]")
}

// TestGroupRankLostFailsItsRooms: a rank's session lost without goodbye
// fails at once every room that still needs it, including one it never
// reported in; a room it no longer owes anything to is not failed by it.
func TestGroupRankLostFailsItsRooms(t *testing.T) {
	r := newRig(t, decode.Config{Group: group2})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7, 8, 9, 10, 11}))
	require.NoError(t, r.srv.Expect(8, []int{0, 1, 2, 3}))
	require.NoError(t, r.srv.Expect(9, []int{12, 13}))
	c0, c1 := r.dialRank(t, 0), r.dialRank(t, 1)
	require.NoError(t, c0.Notify(waitCtx(t), rankNotice(0, 7, 0, 4, 4, false, system.Succeeded)))
	require.NoError(t, c1.Notify(waitCtx(t), rankNotice(1, 9, 0, 2, 12, true, system.Succeeded)))
	require.NoError(t, r.srv.Disconnect("rank-1", errors.New("evicted")))
	_, revocable := r.tr.(rdma.PeerAccessor)
	for _, id := range []uint64{7, 8} {
		_, err := r.srv.Wait(waitCtx(t), id)
		assert.ErrorIs(t, err, decode.ErrPrefillLost, "room %d", id)
		assert.Equal(t, !revocable, errors.Is(err, decode.ErrNotQuiesced), "room %d: %v", id, err)
	}
	// Rank 0 still owes room 9 its page 0, and can deliver it.
	require.NoError(t, c0.Notify(waitCtx(t), rankNotice(0, 9, 0, 2, 12, true, system.Succeeded)))
	room, err := r.srv.Wait(waitCtx(t), 9)
	require.NoError(t, err)
	assert.True(t, room.Complete)
}

// TestGroupHelloNeedsRank: a session without a valid rank is refused by a
// group's server.
func TestGroupHelloNeedsRank(t *testing.T) {
	r := newRig(t, decode.Config{Group: group2})
	for _, md := range []map[string]string{nil, {decode.RankKey: "2"}, {decode.RankKey: "x"}} {
		_, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Metadata: md})
		assert.ErrorIs(t, err, decode.ErrBadInput, "%v", md)
	}
	_, err := decode.New(r.node, nil, decode.Config{Group: &decode.Group{Size: 0, PageSize: 4}})
	assert.ErrorIs(t, err, decode.ErrBadInput)
}

// TestGroupRoomAfterRankLost: a room first announced after a rank's
// session was lost fails at once (it would wait for that rank for ever),
// until a session of that rank says Hello again.
func TestGroupRoomAfterRankLost(t *testing.T) {
	r := newRig(t, decode.Config{Group: group2, AcceptUnknownRooms: true})
	c0, _ := r.dialRank(t, 0), r.dialRank(t, 1)
	require.NoError(t, r.srv.Disconnect("rank-1", errors.New("evicted")))
	require.NoError(t, r.srv.Expect(5, []int{10, 11}))
	_, err := r.srv.Wait(waitCtx(t), 5)
	require.ErrorIs(t, err, decode.ErrPrefillLost, "rank 1 cannot report room 5")
	err = c0.Notify(waitCtx(t), rankNotice(0, 5, 0, 2, 10, true, system.Succeeded))
	require.ErrorIs(t, err, decode.ErrBadInput, "the room already ended")
	r.dialRank(t, 1)
	require.NoError(t, c0.Notify(waitCtx(t), rankNotice(0, 1, 0, 2, 0, false, system.Succeeded)))
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = r.srv.Wait(short, 1)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "rank 1 is back: the room waits for it")
}

// TestGroupRoomTimeout: a room that a rank never completes fails after
// Config.RoomTimeout.
func TestGroupRoomTimeout(t *testing.T) {
	r := newRig(t, decode.Config{Group: group2, RoomTimeout: 200 * time.Millisecond})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7, 8, 9, 10, 11}))
	start := time.Now()
	_, err := r.srv.Wait(waitCtx(t), 7)
	assert.ErrorIs(t, err, decode.ErrChunkFailed)
	assert.Contains(t, err.Error(), "not complete within 200ms")
	assert.Less(t, time.Since(start), 5*time.Second)
}
