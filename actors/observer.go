package actors

import (
	"time"

	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/messages"
)

// DataPlaneObserver sees what the engine's data plane does: each posted
// batch, each chunk context's end, each submitter restart. It is the part
// of system.Observer (on which metrics, traces and reports are built) that
// the actors call. Its methods are called from engine goroutines,
// concurrently, never from the forward thread; they must be quick and must
// not block.
type DataPlaneObserver interface {
	// Batch is called once per posted batch, when it completed or failed.
	Batch(Batch)
	// Chunk is called once per chunk context, when it ended.
	Chunk(messages.Result)
	// Restarted is called when the supervisor restarts a submitter; reason
	// is "endpoint", "device" or "panic".
	Restarted(reason string)
}

// Batch is one posted batch's life.
type Batch struct {
	Chunk     messages.Chunk
	Seq       int // group, or messages.Rest
	Dest      int
	Submitter int
	Bytes     uint64
	Blocks    int
	// The submitter waited the event over [WaitStart, WaitEnd), posted at
	// Posted; the transport reported completion at Done.
	WaitStart, WaitEnd, Posted, Done time.Time
	// EventDone is when the device passed the gating event, where the
	// stream says (cuda.Timed); zero otherwise. WaitEnd minus it is the
	// engine's detection delay.
	EventDone time.Time
	Err       error
}

// eventDone returns ev's device timestamp, or zero.
func eventDone(ev messages.Event) time.Time {
	if t, ok := ev.(cuda.Timed); ok {
		if at, ok := t.CompletedAt(); ok {
			return at
		}
	}
	return time.Time{}
}
