package decode

import (
	"testing"

	"github.com/kvstream/kvstream/decode/internal/core"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A room's end answers the Waits on its instance only: a room released
// before its end was published ends after its id may have been Expected
// again, and the Waits on the newer room keep waiting for theirs.
func TestRoomEndAnswersItsOwnInstance(t *testing.T) {
	s := &Server{waiters: map[uint64][]waiter{}}
	older, newer := make(chan waitResult, 1), make(chan waitResult, 1)
	s.waiters[7] = []waiter{{instance: 1, ch: older}, {instance: 2, ch: newer}}

	s.wake(core.RoomEnded{Room: Room{ID: 7}, Outcome: "lost", Instance: 1})
	require.Len(t, older, 1, "the Wait on the released room hears its end")
	assert.Empty(t, newer, "the Wait on the newer room does not")
	require.Len(t, s.waiters[7], 1)
	assert.Equal(t, uint64(2), s.waiters[7][0].instance)

	s.wake(core.RoomEnded{Room: Room{ID: 7, Complete: true}, Outcome: "complete", Instance: 2})
	require.Len(t, newer, 1)
	assert.True(t, (<-newer).room.Complete)
	assert.NotContains(t, s.waiters, uint64(7), "no Wait left: the id is forgotten")
}
