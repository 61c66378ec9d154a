package system_test

import (
	"context"
	"errors" // the standard library's: what a caller without cockroachdb has
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCancelRoomRefusesLaterChunks: a decode peer's cancel of a room that
// is between two chunks (none live) leaves nothing to drop, but the room's
// later chunks toward that peer are refused (ErrRoomCancelled), so that
// none writes the pages the decode freed; a cancel of a room with a chunk
// queued drops it and refuses the next one; the serving stack hears of
// each cancelled room once.
// TestCancelReasonCutAtACharacter: a reason over the bound is cut at the
// start of a character, so that what the serving stack hears is UTF-8.
func TestCancelReasonCutAtACharacter(t *testing.T) {
	var mu sync.Mutex
	var heard []string
	e := stdEngine(t, sim.NoFault, 5*time.Second, system.WithRoomCancelled(func(_ string, _ uint64, reason string) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, reason)
	}))
	long := strings.Repeat("a", 1023) + "é" + "tail" // the bound (1024) falls inside é
	require.NoError(t, e.CancelRoom(context.Background(), "d", 7, long))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, heard, 1, "told before CancelRoom returns")
	assert.True(t, utf8.ValidString(heard[0]), "%q", heard[0][1000:])
	assert.Equal(t, strings.Repeat("a", 1023), heard[0])
	require.NoError(t, e.Close())
}

func TestCancelRoomRefusesLaterChunks(t *testing.T) {
	type heard struct {
		peer   string
		room   uint64
		reason string
	}
	var mu sync.Mutex
	var got []heard
	e := stdEngine(t, sim.NoFault, 5*time.Second, system.WithRoomCancelled(func(peer string, room uint64, reason string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, heard{peer, room, reason})
	}))
	ctx := context.Background()

	// Room 1: its first chunk is sent and finished, then the decode cancels.
	_, err := e.Register(ctx, chunkSpec(1, 0, 4))
	require.NoError(t, err)
	assert.Equal(t, system.Succeeded, sendAll(t, e, 1).Status)
	require.NoError(t, e.CancelRoom(ctx, "d", 1, "evicted"), "no chunk live: nothing writes it")
	require.NoError(t, e.CancelRoom(ctx, "d", 1, "again"), "a second cancel: the same outcome")
	_, err = e.Register(ctx, chunkSpec(1, 4, 8))
	require.Error(t, err)
	assert.True(t, errors.Is(err, system.ErrRoomCancelled), "%v", err)
	assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	assert.Contains(t, err.Error(), `room 1 was cancelled by its decode peer "d" (evicted)`)
	assert.False(t, e.HasRoom(1), "nothing registered")

	// Room 2: a chunk queued when the decode cancels is dropped, and the
	// next one refused.
	_, err = e.Register(ctx, chunkSpec(2, 0, 4))
	require.NoError(t, err)
	require.True(t, e.HasRoom(2))
	require.NoError(t, e.CancelRoom(ctx, "d", 2, "client gone"))
	assert.False(t, e.HasRoom(2), "dropped")
	_, err = e.Finish(ctx, 2)
	assert.True(t, errors.Is(err, system.ErrNoChunk), "%v", err)
	_, err = e.Register(ctx, chunkSpec(2, 4, 8))
	assert.True(t, errors.Is(err, system.ErrRoomCancelled), "%v", err)

	// Another room is untouched.
	_, err = e.Register(ctx, chunkSpec(3, 0, 8))
	require.NoError(t, err)
	assert.Equal(t, system.Succeeded, sendAll(t, e, 3).Status)

	err = e.CancelRoom(ctx, "nobody", 3, "x")
	assert.True(t, errors.Is(err, system.ErrBadInput), "an unknown peer: %v", err)
	mu.Lock()
	assert.Equal(t, []heard{{"d", 1, "evicted"}, {"d", 2, "client gone"}}, got)
	mu.Unlock()

	require.NoError(t, e.Close())
	err = e.CancelRoom(ctx, "d", 4, "x")
	assert.True(t, errors.Is(err, system.ErrClosed), "%v", err)
}
