package driver

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
)

// cuEventCreate flags. Timing is disabled because nothing here measures
// elapsed time and timing events are more expensive to record and query.
// Blocking sync makes Event.Synchronize sleep in the kernel instead of
// spinning a CPU; it does not change Record or Query.
const (
	eventBlockingSync  = 0x1 // CU_EVENT_BLOCKING_SYNC
	eventDisableTiming = 0x2 // CU_EVENT_DISABLE_TIMING
	eventFlags         = eventBlockingSync | eventDisableTiming
)

// Event is a recorded CUevent. It is safe to share between goroutines and
// needs no release: when the last reference is gone, a cleanup returns the
// CUevent to the device's free list, and the next Record re-records it
// (cuEventRecord overwrites the captured state), so steady-state recording
// creates no driver objects.
type Event struct {
	dev  *Device
	h    uintptr     // CUevent
	done atomic.Bool // completion observed; the handle is never re-recorded while e lives
}

var _ cuda.Event = (*Event)(nil)

// record takes a free CUevent (or creates one) and records it on stream.
func (d *Device) record(stream uintptr) (*Event, error) {
	d.life.RLock()
	defer d.life.RUnlock()
	if d.closed {
		return nil, ErrClosed
	}
	var h uintptr
	d.mu.Lock()
	if n := len(d.free); n > 0 {
		h = d.free[n-1]
		d.free = d.free[:n-1]
	}
	d.mu.Unlock()

	op := "cuEventRecord"
	created := false
	r := d.withCtx(func(a *api) Result {
		if h == 0 {
			if r := a.cuEventCreate(&h, eventFlags); r != Success {
				op = "cuEventCreate"
				return r
			}
			created = true
		}
		return a.cuEventRecord(h, stream)
	})
	if created {
		d.mu.Lock()
		d.events[h] = struct{}{}
		d.created++
		d.mu.Unlock()
	}
	if r != Success {
		if h != 0 {
			// Not back to the free list: the handle may be what is broken.
			d.mu.Lock()
			delete(d.events, h)
			d.mu.Unlock()
			_ = d.withCtx(func(a *api) Result { return a.cuEventDestroy(h) })
		}
		return nil, newError(d.api, op, r)
	}
	e := &Event{dev: d, h: h}
	runtime.AddCleanup(e, d.recycle, h)
	return e, nil
}

// recycleEvent runs (on the runtime's cleanup goroutine) once an Event is
// unreachable: nobody can query or wait on its handle any more.
func (d *Device) recycleEvent(h uintptr) {
	d.life.RLock()
	defer d.life.RUnlock()
	if d.closed {
		return // Close destroyed every handle
	}
	d.putFree(h)
}

// putFree keeps h for reuse, or destroys it when enough are kept. Callers
// hold d.life shared.
func (d *Device) putFree(h uintptr) {
	d.mu.Lock()
	if len(d.free) < maxFreeEvents {
		d.free = append(d.free, h)
		d.mu.Unlock()
		return
	}
	delete(d.events, h)
	d.mu.Unlock()
	// Nothing waits for this error: the handle was abandoned, and a broken
	// context shows up on the next call that someone does wait for.
	_ = d.withCtx(func(a *api) Result { return a.cuEventDestroy(h) })
}

// Handle returns the CUevent, e.g. for cuStreamWaitEvent in the serving
// stack. It stays valid only while the Event is reachable (runtime.KeepAlive
// it after the foreign call).
func (e *Event) Handle() uintptr { return e.h }

// Query implements cuda.Event: (true, nil) once the work captured by Record
// completed, (false, nil) while it runs (CUDA_ERROR_NOT_READY), an error
// when the device failed (marked cuda.ErrDeviceLost when the context is
// gone) or the Device was closed.
func (e *Event) Query() (bool, error) {
	if e.done.Load() {
		return true, nil
	}
	return e.query()
}

// query asks the driver, bypassing the cached completion.
func (e *Event) query() (bool, error) {
	d := e.dev
	d.life.RLock()
	if d.closed {
		d.life.RUnlock()
		return false, ErrClosed
	}
	r := d.withCtx(func(a *api) Result { return a.cuEventQuery(e.h) })
	d.life.RUnlock()
	// e must outlive the call: once e is unreachable its cleanup may hand h
	// to another Record, and this query would observe that recording.
	runtime.KeepAlive(e)
	switch r {
	case Success:
		e.done.Store(true)
		return true, nil
	case ErrorNotReady:
		return false, nil
	}
	return false, newError(d.api, "cuEventQuery", r)
}

// Wait polling schedule: spin (yielding) for spinFor, then sleep with a
// doubling delay from minBackoff up to maxBackoff.
const (
	spinFor    = 50 * time.Microsecond
	minBackoff = 5 * time.Microsecond
	maxBackoff = 200 * time.Microsecond
)

// Wait implements cuda.Event: it returns nil once the event completed, the
// device error if the device failed, or an error wrapping ctx.Err() once ctx
// ended, whichever comes first.
//
// It polls cuEventQuery rather than blocking in cuEventSynchronize, because
// a thread blocked in the driver cannot be interrupted: on a hung kernel a
// cancelled Wait would leave that thread (and its goroutine) stuck, and Close
// would wait for it forever, which breaks "never hang" (docs/ARCHITECTURE.md, invariant
// 9). Polling returns within one backoff step of cancellation. Events the
// engine waits on are usually complete or milliseconds away, so Wait first
// spins briefly with runtime.Gosched (catching completions within
// microseconds), then sleeps with a growing delay capped at maxBackoff to
// bound both the CPU spent and the added latency. Note that on an otherwise
// idle process Go's timers round sub-millisecond sleeps up to about 1 ms on
// Linux, so past the spin phase the added latency is up to ~1 ms; callers
// that can dedicate a thread and need no cancellation can use Synchronize.
func (e *Event) Wait(ctx context.Context) error {
	if e.done.Load() {
		return nil
	}
	spinUntil := time.Now().Add(spinFor)
	delay := minBackoff
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		ok, err := e.query()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return errors.Wrap(err, "cuda driver: waiting for event")
		}
		if time.Now().Before(spinUntil) {
			runtime.Gosched()
			continue
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return errors.Wrap(ctx.Err(), "cuda driver: waiting for event")
		case <-timer.C:
		}
		delay = min(2*delay, maxBackoff)
	}
}

// Synchronize blocks the calling OS thread in cuEventSynchronize until the
// event completed (the thread sleeps: events are created with
// CU_EVENT_BLOCKING_SYNC). It cannot be cancelled and Device.Close waits for
// it; use it only on a thread dedicated to waiting, where the microsecond
// wake-up matters more than a deadline. Wait is the engine's choice.
func (e *Event) Synchronize() error {
	if e.done.Load() {
		return nil
	}
	err := e.dev.call("cuEventSynchronize", func(a *api) Result { return a.cuEventSynchronize(e.h) })
	runtime.KeepAlive(e)
	if err == nil {
		e.done.Store(true)
	}
	return err
}
