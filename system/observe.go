package system

import (
	"time"

	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/messages"
)

// Observer sees what the engine does; metrics and traces are built on it.
// Methods are called concurrently from engine goroutines and from the
// callers of Register and Finish, never from LayerEnd; they must be quick
// and must not block. Embed NopObserver to implement only some methods.
type Observer interface {
	actors.DataPlaneObserver
	// Registered is called for every registration that created a context
	// (re-registrations of an active chunk are not reported).
	Registered(Registration)
	// Refused is called when a registration is refused: class is
	// "bad_input", "unhealthy" or "closed".
	Refused(class string)
	// Finished is called when Finish returns a chunk's result.
	Finished(FinishRecord)
}

// Batch is one posted batch's life, as an Observer sees it.
type Batch = actors.Batch

// FinishRecord is one Finish call.
type FinishRecord struct {
	Result Result
	// Latency is Finish's call → return.
	Latency time.Duration
	// Exposed is Finish's return minus the instant the chunk's forward
	// ended on the device (Result.Stats.ForwardDone); 0 when the chunk
	// never saw a forward end, or its forward still ran on the device when
	// Finish returned.
	Exposed time.Duration
	// Phases split Exposed (HasPhases: the chunk saw a forward end).
	Phases    Phases
	HasPhases bool
	// Returned is when Finish returned.
	Returned time.Time
}

// NopObserver implements Observer and does nothing.
type NopObserver struct{}

// Batch implements Observer.
func (NopObserver) Batch(Batch) {}

// Chunk implements Observer.
func (NopObserver) Chunk(messages.Result) {}

// Restarted implements Observer.
func (NopObserver) Restarted(string) {}

// Registered implements Observer.
func (NopObserver) Registered(Registration) {}

// Refused implements Observer.
func (NopObserver) Refused(string) {}

// Finished implements Observer.
func (NopObserver) Finished(FinishRecord) {}

// observers fans out to several observers.
type observers []Observer

func (os observers) Batch(b Batch) {
	for _, o := range os {
		o.Batch(b)
	}
}

func (os observers) Chunk(r messages.Result) {
	for _, o := range os {
		o.Chunk(r)
	}
}

func (os observers) Restarted(reason string) {
	for _, o := range os {
		o.Restarted(reason)
	}
}

func (os observers) Registered(r Registration) {
	for _, o := range os {
		o.Registered(r)
	}
}

func (os observers) Refused(class string) {
	for _, o := range os {
		o.Refused(class)
	}
}

func (os observers) Finished(f FinishRecord) {
	for _, o := range os {
		o.Finished(f)
	}
}

// Stats is the engine's state right now.
type Stats struct {
	// Live is the number of chunk contexts registered and not yet ended.
	Live int
	// Rooms is the number of rooms with a live chunk context.
	Rooms int
	// BytesInFlight is the bytes of batches posted and not yet completed.
	BytesInFlight int64
	// Queued is the number of work items sent to submitters and not yet
	// answered (the submitters' queue depth).
	Queued int64
	// Restarts is how many times submitters were restarted.
	Restarts int64
	// Unhealthy is the device error that made the engine refuse new
	// registrations, or nil.
	Unhealthy error
}

// Stats returns the engine's state.
func (e *Engine) Stats() Stats {
	return Stats{Live: e.env.Registry.Live(), Rooms: e.env.Registry.RoomCount(), BytesInFlight: e.env.InFlight.Load(),
		Queued: e.env.Queued.Load(), Restarts: e.env.Restarts.Load(), Unhealthy: e.Healthy()}
}
