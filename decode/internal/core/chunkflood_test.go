package core

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chunkFloodCore is a core with one session, "s1" of prefill mallory
// (pages of 4 tokens), on a pool of pages, and room 1 Expected on every
// page when expect says so (else a room is created by its first notice).
func chunkFloodCore(t testing.TB, maxChunks, pages int, expect bool) (*Core, func(Msg) []Effect) {
	pool := []Buffer{{Name: "K", Base: 1 << 20, ItemLen: 64, Pages: pages}, {Name: "V", Base: 1 << 40, ItemLen: 64, Pages: pages}}
	c := NewCore(Rules{MaxSessions: 4, MaxRoomsPerSession: 4, MaxChunksPerRoom: maxChunks, AcceptUnknownRooms: !expect, MaxPoolBytes: 1 << 40}, pool)
	from := Origin{Node: "n-s1"}
	step := func(m Msg) []Effect {
		effs := c.Step(m)
		for _, e := range effs {
			if _, ok := e.(CallOpenAccess); ok {
				effs = append(effs, c.Step(AccessMsg{Address: []byte("ap"), Revocable: true})...)
			}
		}
		return effs
	}
	hello := &wire.Hello{Version: ProtocolVersion, Prefill: "mallory", SessionAddress: from.Node, SessionId: "actor-s1", PageSize: 4,
		Buffers: []*wire.Buffer{{Name: "K", ItemLen: 64, Pages: 16}, {Name: "V", Layer: 1, ItemLen: 64, Pages: 16}}}
	step(HelloMsg{From: from, Hello: hello, Token: "s1"})
	require.Equal(t, 1, c.state().Sessions, "the session opened")
	if expect {
		all := make([]int, pages)
		for i := range all {
			all[i] = i
		}
		effs := step(ExpectMsg{Room: 1, Pages: all})
		require.Equal(t, []Effect{Reply{}}, effs, "room 1 expected")
	}
	return c, step
}

// onePageChunk is the notice of room 1's chunk i: one page, at position i
// on decode page i, not the last.
func onePageChunk(i int) NoticeMsg {
	return NoticeMsg{From: Origin{Node: "n-s1"}, Notice: &wire.ChunkNotice{Session: "s1", Room: 1, Start: int64(4 * i), End: int64(4*i + 4),
		Status: wire.Status_SUCCEEDED, Positions: []int64{int64(i)}, DstPages: []int64{int64(i)}}}
}

// TestChunkFloodPerRoomIsBounded: a session's peer reports chunk after
// distinct one-page chunk of one room, never the last. Without a bound the
// records (and, before the room's decision was kept up to date report by
// report, the server actor's work) grow with what the peer sends. Past
// MaxChunksPerRoom the notice is refused by name, the room fails (the
// peer may still be writing its pages: not quiesced), and the room holds
// at most the bound whatever the number of notices.
func TestChunkFloodPerRoomIsBounded(t *testing.T) {
	for _, expect := range []bool{true, false} {
		t.Run(fmt.Sprintf("expected=%v", expect), func(t *testing.T) {
			const maxChunks, pages = 16, 64
			c, step := chunkFloodCore(t, maxChunks, pages, expect)
			var ended *RoomEnded
			limited := 0
			for i := range pages {
				effs := step(onePageChunk(i))
				a := answer(t, effs)
				switch {
				case i < maxChunks:
					require.Equal(t, AnswerNotice{}, a, "chunk %d within the bound", i)
				case i == maxChunks:
					limited++
					require.Equal(t, wire.Code_REFUSED, a.Code, "chunk %d past the bound", i)
					require.Equal(t, "chunk_limit", a.Reason)
					require.Contains(t, a.Text, fmt.Sprintf("room 1 chunk [%d, %d): the room already holds %d chunks (Config.MaxChunksPerRoom)", 4*i, 4*i+4, maxChunks))
					for _, e := range effs {
						if e, ok := e.(RoomEnded); ok {
							ended = &e
						}
					}
				default:
					require.Equal(t, "room_ended", a.Reason, "chunk %d after the room failed", i)
				}
				if r := c.rooms[1]; r != nil {
					require.LessOrEqual(t, len(r.chunks), maxChunks, "after chunk %d", i)
				}
				require.NoError(t, c.check())
			}
			require.Equal(t, 1, limited)
			require.NotNil(t, ended, "the room failed at the bound")
			require.True(t, errors.Is(ended.Err, ErrChunkFailed) && errors.Is(ended.Err, ErrNotQuiesced), "%v", ended.Err)
			require.Contains(t, ended.Err.Error(), "Config.MaxChunksPerRoom")
			require.Len(t, ended.Room.Chunks, maxChunks)
		})
	}
}

// TestChunkBoundCountsChunksNotReports: in a group every rank owning pages
// of a chunk reports it; the bound is on the room's chunks, so the other
// ranks' reports of a chunk already held are not refused at the bound.
func TestChunkBoundCountsChunksNotReports(t *testing.T) {
	const maxChunks = 2
	pool := []Buffer{{Name: "K", Base: 1 << 20, ItemLen: 64, Pages: 16}}
	c := NewCore(Rules{MaxSessions: 4, MaxRoomsPerSession: 4, MaxChunksPerRoom: maxChunks, MaxPoolBytes: 1 << 20,
		Group: &Group{Size: 2, Rule: cp.SharedKV, PageSize: 4}}, pool)
	step := func(m Msg) []Effect {
		effs := c.Step(m)
		for _, e := range effs {
			if _, ok := e.(CallOpenAccess); ok {
				effs = append(effs, c.Step(AccessMsg{Address: []byte("ap"), Revocable: true})...)
			}
		}
		return effs
	}
	for rank, s := range []string{"s0", "s1"} {
		hello := &wire.Hello{Version: ProtocolVersion, Prefill: "p" + s, SessionAddress: "n-" + s, SessionId: "actor-" + s, PageSize: 4,
			Buffers:  []*wire.Buffer{{Name: "K", ItemLen: 64, Pages: 16}},
			Metadata: map[string]string{RankKey: fmt.Sprint(rank)}}
		step(HelloMsg{From: Origin{Node: "n-" + s}, Hello: hello, Token: s})
	}
	require.Equal(t, 2, c.state().Sessions, "both ranks opened")
	require.Equal(t, []Effect{Reply{}}, step(ExpectMsg{Room: 1, Pages: []int{0, 1, 2, 3, 4, 5}}))
	// Chunks of two pages: rank 0 owns the even positions, rank 1 the odd.
	notice := func(rank, chunk int, last bool) AnswerNotice {
		s := fmt.Sprintf("s%d", rank)
		pos := int64(2*chunk + rank)
		return answer(t, step(NoticeMsg{From: Origin{Node: "n-" + s}, Notice: &wire.ChunkNotice{Session: s, Room: 1, Start: int64(8 * chunk),
			End: int64(8*chunk + 8), Last: last, Status: wire.Status_SUCCEEDED, Positions: []int64{pos}, DstPages: []int64{pos}}}))
	}
	for chunk := range maxChunks {
		for rank := range 2 {
			require.Equal(t, AnswerNotice{}, notice(rank, chunk, false), "rank %d chunk %d", rank, chunk)
		}
	}
	require.Len(t, c.rooms[1].chunks, 2*maxChunks, "each chunk reported by both ranks")
	a := notice(0, maxChunks, true)
	require.Equal(t, "chunk_limit", a.Reason, "a third chunk")
	require.Contains(t, a.Text, fmt.Sprintf("the room already holds %d chunks", maxChunks))
	require.NoError(t, c.check())
}

// BenchmarkChunkFloodOneRoom is the server actor's work for a room fed
// MaxChunksPerRoom distinct one-page chunks (the most a peer can make one
// room hold), in order or from the end: per op, the whole flood into one
// Expected room.
func BenchmarkChunkFloodOneRoom(b *testing.B) {
	for _, n := range []int{1024, 8192} {
		for _, order := range []string{"ascending", "descending"} {
			b.Run(fmt.Sprintf("%d/%s", n, order), func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					c, step := chunkFloodCore(b, n, n, true)
					b.StartTimer()
					for i := range n {
						if order == "descending" {
							i = n - 1 - i
						}
						step(onePageChunk(i))
					}
					b.StopTimer()
					require.Len(b, c.rooms[1].chunks, n)
					b.StartTimer()
				}
			})
		}
	}
}

// TestPositionsPerNoticeAreBounded: under the contiguous rule, in a room
// nobody Expected, a report's positions wait for the last chunk to be
// checked. A rank reporting one-page chunks each carrying every position
// of the pool made the room keep the pool's square (4096 pages: 418 MiB);
// a notice with more positions than its chunk has pages is refused by
// name, so that the positions a room keeps stay within its pages.
func TestPositionsPerNoticeAreBounded(t *testing.T) {
	const pages = 64
	pool := []Buffer{{Name: "K", Base: 1 << 20, ItemLen: 64, Pages: pages}}
	c := NewCore(Rules{MaxSessions: 4, MaxRoomsPerSession: 4, MaxChunksPerRoom: 8192, AcceptUnknownRooms: true, MaxPoolBytes: 1 << 40,
		Group: &Group{Size: 2, Rule: cp.Contiguous, PageSize: 4}}, pool)
	effs := c.Step(HelloMsg{From: Origin{Node: "n-s0"}, Token: "s0", Hello: &wire.Hello{Version: ProtocolVersion, Prefill: "m", SessionAddress: "n-s0",
		SessionId: "a-s0", PageSize: 4, Buffers: []*wire.Buffer{{Name: "K", ItemLen: 64, Pages: 16}}, Metadata: map[string]string{RankKey: "0"}}})
	require.IsType(t, CallOpenAccess{}, effs[0])
	c.Step(AccessMsg{Address: []byte("ap"), Revocable: true})
	require.Equal(t, 1, c.state().Sessions, "the session opened")
	notice := func(room uint64, i int, pos []int64) AnswerNotice {
		return answer(t, c.Step(NoticeMsg{From: Origin{Node: "n-s0"}, Notice: &wire.ChunkNotice{Session: "s0", Room: room, Start: int64(4 * i),
			End: int64(4*i + 4), Status: wire.Status_SUCCEEDED, Positions: pos, DstPages: pos}}))
	}
	every := make([]int64, pages)
	for i := range pages {
		a := notice(1, i, every)
		require.Equal(t, wire.Code_BAD_INPUT, a.Code, "chunk %d", i)
		require.Contains(t, a.Text, fmt.Sprintf("room 1 chunk [%d, %d): %d positions, more than its 1 pages", 4*i, 4*i+4, pages))
	}
	require.Nil(t, c.rooms[1], "no room made of refused notices")
	// One position per one-page chunk is what a rank may send.
	for i := range pages {
		require.Equal(t, AnswerNotice{}, notice(2, i, []int64{int64(i)}), "chunk %d", i)
	}
	kept := 0
	for _, ch := range c.rooms[2].chunks {
		kept += len(ch.Positions)
	}
	require.LessOrEqual(t, kept, pages)
	require.NoError(t, c.check())
}

// TestReportsClaimAPageOfTheirChunk: a successful report of no page, or of
// a position outside its chunk's pages, is refused by name before the room
// keeps anything. Such reports claim no pool page, so, while a room's
// request page count is unknown, they could fill every room of a session up
// to MaxChunksPerRoom: with every admitted chunk claiming a page of its
// own, the pool bounds them across the session's rooms.
func TestReportsClaimAPageOfTheirChunk(t *testing.T) {
	c, step := chunkFloodCore(t, 8192, 16, false)
	pageless := onePageChunk(3)
	pageless.Notice.Positions, pageless.Notice.DstPages = nil, nil
	outside := onePageChunk(4)
	outside.Notice.Positions = []int64{5} // chunk 4 is page 4
	for _, tc := range []struct {
		m    NoticeMsg
		want string
	}{
		{pageless, "room 1 chunk [12, 16): a successful chunk of 1 pages reported with no page"},
		{outside, "room 1 chunk [16, 20): position 5 at index 0 is outside the chunk's pages [4, 5)"},
	} {
		var refused string
		for _, e := range step(tc.m) {
			if a, ok := e.(AnswerNotice); ok {
				require.Equal(t, wire.Code_BAD_INPUT, a.Code)
				refused = a.Text
			}
		}
		require.Contains(t, refused, tc.want)
	}
	// A failed report of no page is the prefill saying it sent nothing.
	failed := onePageChunk(6)
	failed.Notice.Positions, failed.Notice.DstPages, failed.Notice.Status = nil, nil, wire.Status_FAILED
	for _, e := range step(failed) {
		if a, ok := e.(AnswerNotice); ok {
			require.NotEqual(t, wire.Code_BAD_INPUT, a.Code, "%s", a.Text)
		}
	}
	_ = c
}

// TestPagelessChunksAreBoundedByThePool: a successful non-last chunk
// shorter than a page claims no pool page. In a group whose owner rule
// cannot check a report before the room's last chunk (contiguous), the
// pool does not bound such chunks of rooms nobody Expected as it bounds
// the others: a rank that reports them room after room is refused by name
// once its rooms hold as many as the pool has pages (the room fails, not
// quiesced), and the count is given back when its rooms are forgotten.
func TestPagelessChunksAreBoundedByThePool(t *testing.T) {
	const pages, perRoom = 16, 6
	pool := []Buffer{{Name: "K", Base: 1 << 20, ItemLen: 64, Pages: pages}}
	c := NewCore(Rules{MaxSessions: 4, MaxRoomsPerSession: 64, MaxChunksPerRoom: 64, AcceptUnknownRooms: true, MaxPoolBytes: 1 << 40,
		Group: &Group{Size: 2, Rule: cp.Contiguous, PageSize: 4}}, pool)
	from := Origin{Node: "n-s1"}
	c.Step(HelloMsg{From: from, Token: "s1", Hello: &wire.Hello{Version: ProtocolVersion, Prefill: "mallory", SessionAddress: from.Node,
		SessionId: "actor-s1", PageSize: 4, Buffers: []*wire.Buffer{{Name: "K", ItemLen: 64, Pages: 16}}, Metadata: map[string]string{RankKey: "0"}}})
	c.Step(AccessMsg{Address: []byte("ap"), Revocable: true})
	require.Equal(t, 1, c.state().Sessions, "the session opened")
	// pageless is room's chunk i: tokens [4i, 4i+1), not the last: no whole
	// page, so none to claim.
	pageless := func(room uint64, i int) NoticeMsg {
		return NoticeMsg{From: from, Notice: &wire.ChunkNotice{Session: "s1", Room: room, Start: int64(4 * i), End: int64(4*i + 1), Status: wire.Status_SUCCEEDED}}
	}
	admitted := 0
	var refused *AnswerNotice
	var room uint64
	for room = 1; refused == nil && room <= 8; room++ {
		for i := range perRoom {
			a := answer(t, c.Step(pageless(room, i)))
			if a.Code != wire.Code_OK {
				refused = &a
				break
			}
			admitted++
		}
	}
	require.NotNil(t, refused, "pageless chunks past the pool's pages are refused")
	assert.Equal(t, pages, admitted, "as many as the pool has pages")
	assert.Equal(t, wire.Code_REFUSED, refused.Code)
	assert.Equal(t, "chunk_limit", refused.Reason)
	assert.Contains(t, refused.Text, "a successful chunk of no page, and the session's rooms nobody Expected already hold 16 such chunks (as many as the pool has pages)")
	assert.Zero(t, c.state().PagesHeld, "none claimed a page")

	// The rank fails the other rooms, its writes stopped: they end and are
	// forgotten, their count is given back, and a pageless chunk is
	// admitted again.
	for r := uint64(1); r < room-1; r++ {
		failed := NoticeMsg{From: from, Notice: &wire.ChunkNotice{Session: "s1", Room: r, Start: 4 * perRoom, End: 4*perRoom + 2, Last: true,
			Status: wire.Status_FAILED, Error: "prefill failed"}}
		c.Step(failed)
	}
	require.Equal(t, wire.Code_OK, answer(t, c.Step(pageless(100, 0))).Code, "the rooms forgotten gave their count back")
	require.NoError(t, c.check())
}
