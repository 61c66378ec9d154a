package launch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func closed(bt *batch) bool {
	select {
	case <-bt.done:
		return true
	default:
		return false
	}
}

// TestBookEndsABatchWhenAllReported: a batch ends once every rank and
// every room reported; it is complete only when every rank was OK and
// every room complete; only the batch's own instance speaks for its rooms.
func TestBookEndsABatchWhenAllReported(t *testing.T) {
	k := newBook(2, 2)
	bt := k.start(0, "decode-0")
	k.rankReported(Event{Batch: 0, Rank: 0, OK: true, Bytes: 10})
	k.roomEnded("decode-1", Event{Batch: 0, Room: 0, Complete: true}) // not its instance
	k.roomEnded("decode-0", Event{Batch: 0, Room: 0, Complete: true})
	k.rankReported(Event{Batch: 0, Rank: 0, OK: true, Bytes: 10}) // a repeat is ignored
	assert.False(t, closed(bt))
	k.rankReported(Event{Batch: 0, Rank: 1, OK: true, Bytes: 5})
	assert.False(t, closed(bt), "a room still open")
	k.roomEnded("decode-0", Event{Batch: 0, Room: 1, Complete: true})
	require.True(t, closed(bt))
	rows, complete := k.rows(1)
	assert.True(t, complete)
	assert.Equal(t, BatchRow{Batch: 0, Decode: "decode-0", Complete: true, RoomsComplete: 2, RanksOK: 2, RanksReported: 2, Bytes: 15,
		Seconds: rows[0].Seconds}, rows[0])

	bt = k.start(1, "decode-0")
	k.rankReported(Event{Batch: 1, Rank: 0, OK: false, Failed: 3, Error: "finish timed out"})
	k.rankReported(Event{Batch: 1, Rank: 1, OK: true})
	k.roomEnded("decode-0", Event{Batch: 1, Room: 0, Error: "rank 0 failed chunk [0, 512)"})
	k.roomEnded("decode-0", Event{Batch: 1, Room: 1, Complete: true})
	require.True(t, closed(bt))
	rows, complete = k.rows(2)
	assert.False(t, complete)
	assert.Equal(t, 3, rows[1].FailedChunks)
	assert.Equal(t, 1, rows[1].RoomsFailed)
	assert.Equal(t, "rank 0: finish timed out", rows[1].Error, "the first failure names its rank")
	_, complete = k.rows(3)
	assert.False(t, complete, "a batch not started is not complete")
}

// TestBookNodesGone: a decode instance's exit fails its open batches'
// rooms; a rank's exit counts as its report; with both, the batch ends.
func TestBookNodesGone(t *testing.T) {
	k := newBook(2, 3)
	bt := k.start(0, "decode-0")
	other := k.start(1, "decode-1")
	k.faulted(time.Now())
	k.roomEnded("decode-0", Event{Batch: 0, Room: 0, Complete: true})
	k.decodeExited("decode-0")
	assert.False(t, closed(bt), "its ranks have not reported yet")
	k.rankReported(Event{Batch: 0, Rank: 0, FirstFailureUnixMs: time.Now().UnixMilli()})
	k.rankExited(1)
	require.True(t, closed(bt))
	assert.False(t, closed(other), "another instance's batch is not touched by decode-0's exit")
	rows, _ := k.rows(1)
	assert.Equal(t, 1, rows[0].RoomsComplete)
	assert.Equal(t, 2, rows[0].RoomsFailed)
	assert.Equal(t, "decode instance decode-0 exited", rows[0].Error)
	assert.False(t, rows[0].Complete)
	assert.Equal(t, 1, k.open())
	k.expire(other, "not ended within 2m")
	assert.True(t, closed(other))
	assert.Zero(t, k.open())
}

// TestBookDrained: a drain loses the batches in flight at its start that
// did not complete; batches ended before it, or started after, are not
// its.
func TestBookDrained(t *testing.T) {
	k := newBook(1, 1)
	done := k.start(0, "d")
	k.rankReported(Event{Batch: 0, OK: true})
	k.roomEnded("d", Event{Batch: 0, Complete: true})
	require.True(t, closed(done))
	time.Sleep(10 * time.Millisecond) // batch 0 ended strictly before the drain
	ok := k.start(1, "d")
	lost := k.start(2, "d")
	at := time.Now()
	k.rankReported(Event{Batch: 1, OK: true})
	k.roomEnded("d", Event{Batch: 1, Complete: true})
	require.True(t, closed(ok))
	k.expire(lost, "the drain ended before the batch did")
	d := k.drained(at)
	assert.Equal(t, 2, d.InFlight)
	assert.Equal(t, 1, d.Lost)
}

// TestBookDrainedInstanceExit: an instance that drained exits once its
// ranks said goodbye, which the launcher may hear before their batch
// events: a batch whose rooms all completed there lost nothing.
func TestBookDrainedInstanceExit(t *testing.T) {
	k := newBook(2, 2)
	bt := k.start(0, "decode-0")
	k.roomEnded("decode-0", Event{Batch: 0, Room: 0, Complete: true})
	k.roomEnded("decode-0", Event{Batch: 0, Room: 1, Complete: true})
	k.decodeExited("decode-0")
	k.rankReported(Event{Batch: 0, Rank: 0, OK: true})
	k.rankReported(Event{Batch: 0, Rank: 1, OK: true})
	require.True(t, closed(bt))
	rows, complete := k.rows(1)
	assert.True(t, complete, "%+v", rows)
	assert.Empty(t, rows[0].Error)
	assert.Zero(t, rows[0].RoomsFailed)
}
