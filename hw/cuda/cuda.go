// Package cuda defines what kvstream needs from a GPU: a compute stream on
// which it records events, and events it can query and wait on. Write-before-
// read (invariant 1 of docs/ARCHITECTURE.md) rests on these two: an event recorded after a
// group's last layer was enqueued completes only when that layer's KV is in
// memory.
//
// Implementations: hw/cuda/sim (a virtual GPU, the default and the test
// double) and hw/cuda/driver (libcuda through purego).
package cuda

import (
	"context"

	"github.com/cockroachdb/errors"
)

// Stream is an ordered queue of device work. Implementations must allow
// Record from any goroutine.
type Stream interface {
	// Record returns an event that completes when every piece of work
	// enqueued on the stream before the call has executed.
	Record() (Event, error)
}

// Event is a point in a stream's execution.
type Event interface {
	// Query reports, without blocking, whether the event completed. An error
	// means the device failed; "not yet" is (false, nil).
	Query() (bool, error)
	// Wait blocks until the event completed, the device failed, or ctx ended
	// (then it returns an error that wraps ctx.Err()).
	Wait(ctx context.Context) error
}

// ErrDeviceLost marks errors after which the CUDA context is unusable (for
// example an illegal address or a lost device). The engine escalates them
// and reports itself unhealthy; other device errors fail one chunk.
var ErrDeviceLost = errors.New("cuda: device lost")
