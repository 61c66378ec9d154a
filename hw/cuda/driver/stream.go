package driver

import (
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
)

// Stream is a CUstream of a Device. Its methods are safe for concurrent use.
type Stream struct {
	dev   *Device
	h     uintptr // CUstream; 0 is the legacy default stream
	owned bool    // created by NewStream, so Close destroys it
	// use is held shared by every call on the stream from its check of
	// closed to the driver's return, and by Close exclusively: a call
	// that passed the check never reaches the driver with a destroyed
	// CUstream (a freed pointer, which a new stream may reuse). Device.Close
	// takes the device's lock instead, which every driver call holds.
	use    sync.RWMutex
	closed atomic.Bool
}

var _ cuda.Stream = (*Stream)(nil)

// cuStreamCreate flags.
const streamDefault = 0x0 // CU_STREAM_DEFAULT

// NewStream creates a stream owned by the caller (Close destroys it). It is
// a blocking stream (CU_STREAM_DEFAULT): it synchronizes with the legacy
// default stream, so that the synchronous CopyHtoD/CopyDtoH/MemsetD8 of
// Device are ordered with the work enqueued here. Serving stacks bring their
// own non-blocking streams through WrapStream.
func (d *Device) NewStream() (*Stream, error) {
	s := &Stream{dev: d, owned: true}
	d.life.RLock()
	defer d.life.RUnlock()
	if d.closed {
		return nil, ErrClosed
	}
	if r := d.withCtx(func(a *api) Result { return a.cuStreamCreate(&s.h, streamDefault) }); r != Success {
		return nil, newError(d.api, "cuStreamCreate", r)
	}
	d.mu.Lock()
	d.streams[s] = struct{}{}
	d.mu.Unlock()
	return s, nil
}

// WrapStream adapts a CUstream that the serving stack owns (created in this
// device's primary context, e.g. by the CUDA runtime API). The special
// handles work too: 0 and CU_STREAM_LEGACY (0x1) are the legacy default
// stream, CU_STREAM_PER_THREAD (0x2) the calling thread's default stream
// (which, from Go, is whichever OS thread runs the call: avoid it). The
// Stream never destroys the handle: Close only stops its use through the
// wrapper.
func (d *Device) WrapStream(handle uintptr) *Stream {
	return &Stream{dev: d, h: handle}
}

// Handle returns the CUstream.
func (s *Stream) Handle() uintptr { return s.h }

// Device returns the stream's device.
func (s *Stream) Device() *Device { return s.dev }

// call is Device.call that also fails once the stream was closed.
func (s *Stream) call(op string, f func(a *api) Result) error {
	s.use.RLock()
	defer s.use.RUnlock()
	if s.closed.Load() {
		return errors.Wrap(ErrClosed, "stream")
	}
	return s.dev.call(op, f)
}

// Record implements cuda.Stream: the event completes when all work enqueued
// on the stream before the call has executed.
func (s *Stream) Record() (cuda.Event, error) {
	e, err := s.RecordEvent()
	if err != nil {
		return nil, err // not e: a nil *Event in a cuda.Event is not nil
	}
	return e, nil
}

// RecordEvent is Record returning the concrete type.
func (s *Stream) RecordEvent() (*Event, error) {
	s.use.RLock()
	defer s.use.RUnlock()
	if s.closed.Load() {
		return nil, errors.Wrap(ErrClosed, "stream")
	}
	return s.dev.record(s.h)
}

// Synchronize blocks the calling thread until all work enqueued on the
// stream has executed. It cannot be cancelled, and Device.Close waits for
// it; prefer Record + Event.Wait where a deadline matters.
func (s *Stream) Synchronize() error {
	return s.call("cuStreamSynchronize", func(a *api) Result { return a.cuStreamSynchronize(s.h) })
}

// CopyDtoDAsync enqueues a copy of n bytes from src to dst (both device
// addresses). It returns at once; Record after it to know when it is done.
func (s *Stream) CopyDtoDAsync(dst, src DevicePtr, n int) error {
	if n < 0 {
		return errors.Newf("cuda driver: CopyDtoDAsync of %d bytes", n)
	}
	return s.call("cuMemcpyDtoDAsync", func(a *api) Result {
		return a.cuMemcpyDtoDAsync(uint64(dst), uint64(src), uintptr(n), s.h)
	})
}

// MemsetD8Async enqueues setting n bytes at dst to v.
func (s *Stream) MemsetD8Async(dst DevicePtr, v byte, n int) error {
	if n < 0 {
		return errors.Newf("cuda driver: MemsetD8Async of %d bytes", n)
	}
	return s.call("cuMemsetD8Async", func(a *api) Result {
		return a.cuMemsetD8Async(uint64(dst), v, uintptr(n), s.h)
	})
}

// Close destroys a stream created by NewStream (after the device finished
// its work: cuStreamDestroy does not wait but releases resources once the
// work is done). For a wrapped stream it only stops use through the wrapper.
// Closing twice is a no-op. It waits for the calls under way on the
// stream.
func (s *Stream) Close() error {
	s.use.Lock()
	defer s.use.Unlock()
	if !s.closed.CompareAndSwap(false, true) || !s.owned {
		return nil
	}
	d := s.dev
	d.life.RLock()
	defer d.life.RUnlock()
	if d.closed {
		return nil // Device.Close destroyed it
	}
	d.mu.Lock()
	delete(d.streams, s)
	d.mu.Unlock()
	if r := d.withCtx(func(a *api) Result { return a.cuStreamDestroy(s.h) }); r != Success {
		return newError(d.api, "cuStreamDestroy", r)
	}
	return nil
}
