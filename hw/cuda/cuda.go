package cuda

import (
	"context"
	"time"

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

// Timed is implemented by events whose stream knows when the device passed
// them. Exposed transfer time starts there (docs/OBSERVABILITY.md): the
// host's call that recorded the event only queued it, and the GPU may run
// behind by a whole forward.
type Timed interface {
	// CompletedAt returns the host wall-clock instant at which the device
	// passed the event, and false while it has not (or failed).
	CompletedAt() (time.Time, bool)
}

// ErrDeviceLost marks errors after which the CUDA context is unusable (for
// example an illegal address or a lost device). The engine escalates them
// and reports itself unhealthy; other device errors fail one chunk.
var ErrDeviceLost = errors.New("cuda: device lost")
