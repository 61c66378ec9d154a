package system

import (
	"context"
	"testing"
	"time"

	"github.com/kvstream/kvstream/actors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// processes counts the actor system's registered processes (actors,
// hosted rooms and chunks).
func processes(e *Engine) int {
	n := 0
	for _, b := range e.system.ProcessRegistry.LocalPIDs.LocalPIDs {
		n += b.Count()
	}
	return n
}

// TestCyclesLeaveNothingBehind: cycles of 1 024 rooms registered, sent in
// one forward and finished, each cycle with new room ids, leave the
// engine's per-room and per-chunk records as they were before the first:
// no live room or chunk in the registry, no chunk process and no room
// process beyond the idle ones the manager keeps for later rooms, nothing
// queued or in flight, the end-of-forward events within their bound. (What
// the heap keeps growing over the first hundred such cycles, about 11 MB
// and then flat, is protoactor's process registry: 32 768 small maps, each
// keeping its storage once a process id hashed to it.)
func TestCyclesLeaveNothingBehind(t *testing.T) {
	e := newEngine(t, nil)
	ctx := context.Background()
	const rooms, cycles = 1024, 4
	before := processes(e)
	next := uint64(1)
	for range cycles {
		first := next
		for i := range rooms {
			_, err := e.Register(ctx, ChunkSpec{Room: next, Start: 0, End: 4, Last: true, SrcPages: []int{i % pages}, TotalPages: 1,
				Infos: []DecodeInfo{{Peer: "d", DstPages: []int{(i + 1) % pages}}}})
			require.NoError(t, err)
			next++
		}
		require.Equal(t, rooms, e.env.Registry.RoomCount())
		fw, err := e.BeginForward()
		require.NoError(t, err)
		for l := range 3 {
			require.NoError(t, fw.LayerEnd(l))
		}
		require.NoError(t, fw.End())
		for r := first; r < next; r++ {
			_, err := e.Finish(ctx, r)
			require.NoError(t, err)
		}
		assert.Zero(t, e.env.Registry.Live(), "live chunks")
		assert.Zero(t, e.env.Registry.RoomCount(), "live rooms")
		assert.Zero(t, e.env.Queued.Load(), "Works queued")
		assert.Zero(t, e.env.InFlight.Load(), "bytes in flight")
		assert.Zero(t, e.env.Registry.ToPeer("d"), "chunks sending to the peer")
		// A room goes idle after its Finish answered, and the manager keeps
		// its process for a later room (up to actors.MaxIdleRooms): wait for
		// the processes to settle there (a condition, not a time), the same
		// count every cycle.
		kept := before + min(rooms, actors.MaxIdleRooms)
		require.Eventually(t, func() bool { return processes(e) == kept }, time.Minute, time.Millisecond,
			"processes: %d, want %d (%d before the first cycle, and the idle rooms kept)", processes(e), kept, before)
	}
	e.ends.mu.Lock()
	assert.LessOrEqual(t, len(e.ends.m), 2*keptEnds)
	e.ends.mu.Unlock()
	e.cancels.mu.RLock()
	assert.Empty(t, e.cancels.set)
	e.cancels.mu.RUnlock()
}
