package core

import (
	"fmt"
	"testing"

	"github.com/kvstream/kvstream/messages/wire"
	"github.com/stretchr/testify/require"
)

// TestNoticeFloodIsBounded: a session's peer announces room after room
// nobody Expected, each ended at once in a way that leaves its pages
// unquiet until the session is cut off (a failure the prefill says is not
// quiesced, a page another room holds). Each such room must count against
// MaxRoomsPerSession until it is forgotten: past the bound the notice is
// refused by name, and the core holds at most that many of the session's
// rooms whatever the number of notices.
func TestNoticeFloodIsBounded(t *testing.T) {
	floods := map[string]func(room uint64) *wire.ChunkNotice{
		"failed not quiesced": func(room uint64) *wire.ChunkNotice {
			return &wire.ChunkNotice{Room: room, Start: 0, End: 4, Last: true, Status: wire.Status_FAILED, Error: "finish timed out",
				NotQuiesced: true, Positions: []int64{0}, DstPages: []int64{int64(1 + room%15)}} // each on a free page: the not-quiesced path, not a held page
		},
		"page of another room": func(room uint64) *wire.ChunkNotice {
			return &wire.ChunkNotice{Room: room, Start: 0, End: 4, Last: true, Status: wire.Status_SUCCEEDED,
				Positions: []int64{0}, DstPages: []int64{0}}
		},
	}
	for name, flood := range floods {
		t.Run(name, func(t *testing.T) {
			const maxRooms, notices = 4, 10000 // chunkFloodCore's MaxRoomsPerSession
			c, step := chunkFloodCore(t, 4, 16, false)
			from := Origin{Node: "n-s1"}
			// Room 1 holds page 0: the flood's page of another room.
			n := &wire.ChunkNotice{Session: "s1", Room: 1, Start: 0, End: 4, Status: wire.Status_SUCCEEDED, Positions: []int64{0}, DstPages: []int64{0}}
			require.Equal(t, AnswerNotice{}, answer(t, step(NoticeMsg{From: from, Notice: n})))

			limited := 0
			for room := uint64(100); room < 100+notices; room++ {
				n := flood(room)
				n.Session = "s1"
				a := answer(t, step(NoticeMsg{From: from, Notice: n}))
				if a.Reason == "room_limit" {
					limited++
					require.Contains(t, a.Text, fmt.Sprintf("room %d: the session already holds %d rooms", room, maxRooms))
				}
				require.LessOrEqual(t, len(c.rooms), maxRooms, "after room %d: the core holds %d rooms of one session", room, len(c.rooms))
				require.NoError(t, c.check())
			}
			require.Equal(t, notices-(maxRooms-1), limited, "every notice past the bound refused by name")
		})
	}
}

// answer is the AnswerNotice among effs.
func answer(t *testing.T, effs []Effect) AnswerNotice {
	t.Helper()
	for _, e := range effs {
		if a, ok := e.(AnswerNotice); ok {
			return a
		}
	}
	require.Fail(t, "no AnswerNotice", "%v", effs)
	return AnswerNotice{}
}
