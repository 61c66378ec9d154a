package driver

import (
	"runtime"
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// DevicePtr is a device address (CUdeviceptr). Offsets are plain additions:
// p + DevicePtr(off).
type DevicePtr uint64

// Device is one GPU's primary context. All methods are safe for concurrent
// use from any goroutine.
type Device struct {
	api     *api
	ordinal int
	dev     int32   // CUdevice
	ctx     uintptr // CUcontext: the retained primary context
	name    string
	recycle func(uintptr) // d.recycleEvent, bound once: a method value allocates

	// life orders driver calls against Close: every call holds it shared,
	// Close holds it exclusively, so Close waits for calls in flight and no
	// call runs on a released context or a destroyed handle.
	life   sync.RWMutex
	closed bool // guarded by life

	// mu guards the sets below (they change under life held shared).
	mu      sync.Mutex
	free    []uintptr            // recorded-and-abandoned CUevents, ready to re-record
	events  map[uintptr]struct{} // every CUevent created here and not destroyed
	streams map[*Stream]struct{} // streams created by NewStream and not closed
	created uint64               // cuEventCreate calls, for tests and stats
}

// maxFreeEvents bounds the event free list. Events in flight at one time are
// a few per active chunk; beyond the bound, handles are destroyed instead of
// kept.
const maxFreeEvents = 4096

// Open loads the driver (once per process), checks that device (an ordinal,
// 0-based, as CUDA_VISIBLE_DEVICES renumbers them) exists and retains its
// primary context. Failures are marked ErrNoDriver or ErrNoDevice.
func Open(device int) (*Device, error) {
	a, err := load()
	if err != nil {
		return nil, err
	}
	return open(a, device)
}

// open does Open's per-device part over any function table (tests pass a
// fake).
func open(a *api, device int) (*Device, error) {
	var count int32
	if r := a.cuDeviceGetCount(&count); r != Success {
		return nil, errors.Mark(newError(a, "cuDeviceGetCount", r), ErrNoDevice)
	}
	if count == 0 {
		return nil, errors.Mark(errors.New("cuda driver: no CUDA device present"), ErrNoDevice)
	}
	if device < 0 || device >= int(count) {
		return nil, errors.Mark(errors.Newf("cuda driver: device %d requested but %d device(s) present", device, count), ErrNoDevice)
	}
	var dev int32
	if r := a.cuDeviceGet(&dev, int32(device)); r != Success {
		return nil, errors.Mark(newError(a, "cuDeviceGet", r), ErrNoDevice)
	}
	var buf [256]byte
	name := ""
	if a.cuDeviceGetName(&buf[0], int32(len(buf)), dev) == Success {
		name = goString(&buf[0])
	}
	var ctx uintptr
	if r := a.cuDevicePrimaryCtxRetain(&ctx, dev); r != Success {
		// 46/999 here mean the device is prohibited or exclusive to another
		// process: it exists, but not for us.
		return nil, errors.Mark(errors.Wrapf(newError(a, "cuDevicePrimaryCtxRetain", r), "cuda driver: device %d (%s)", device, name), ErrNoDevice)
	}
	d := &Device{
		api:     a,
		ordinal: device,
		dev:     dev,
		ctx:     ctx,
		name:    name,
		events:  make(map[uintptr]struct{}),
		streams: make(map[*Stream]struct{}),
	}
	d.recycle = d.recycleEvent
	return d, nil
}

// Ordinal returns the device index passed to Open.
func (d *Device) Ordinal() int { return d.ordinal }

// Name returns the device's product name, e.g. "NVIDIA H200".
func (d *Device) Name() string { return d.name }

// Context returns the primary context handle (CUcontext), for serving stacks
// that pass it to their own driver calls.
func (d *Device) Context() uintptr { return d.ctx }

// Close destroys the streams and events this Device created and releases the
// primary context. It waits for driver calls in flight (including a
// Stream.Synchronize or Event.Synchronize, which cannot be interrupted).
// Afterwards every method returns ErrClosed. Device memory is not tracked:
// Free it before Close (the driver frees it when the last retainer of the
// primary context releases it). Closing twice is a no-op.
func (d *Device) Close() error {
	d.life.Lock()
	defer d.life.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.mu.Lock()
	streams := d.streams
	events := d.events
	d.streams, d.events, d.free = nil, nil, nil
	d.mu.Unlock()

	var errs error
	r := d.withCtx(func(a *api) Result {
		for s := range streams {
			s.closed.Store(true)
			if r := a.cuStreamDestroy(s.h); r != Success {
				errs = errors.CombineErrors(errs, newError(a, "cuStreamDestroy", r))
			}
		}
		for h := range events {
			if r := a.cuEventDestroy(h); r != Success {
				errs = errors.CombineErrors(errs, newError(a, "cuEventDestroy", r))
			}
		}
		return Success
	})
	if r != Success {
		errs = errors.CombineErrors(errs, newError(d.api, "cuCtxSetCurrent", r))
	}
	if r := d.api.cuDevicePrimaryCtxRelease(d.dev); r != Success {
		errs = errors.CombineErrors(errs, newError(d.api, "cuDevicePrimaryCtxRelease", r))
	}
	return errs
}

// withCtx runs f with the primary context current on the calling OS thread,
// which is what every context-scoped driver call needs. The goroutine is
// locked to its thread for the duration, because Go may otherwise move it to
// another thread between cuCtxSetCurrent and the call. The thread's previous
// context is restored afterwards: a serving stack may keep its own context
// current on a thread it locked, and must find it there after calling us.
// When the primary context is already current (the usual case on a serving
// stack's thread that uses the runtime API on this device) this costs one
// cuCtxGetCurrent.
//
// A failure to read or switch the context is returned as is and so reported
// under the caller's operation name; its code (201, 709, 4...) says what
// happened. Callers hold d.life shared (or exclusively, in Close).
func (d *Device) withCtx(f func(a *api) Result) Result {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a := d.api
	var prev uintptr
	if r := a.cuCtxGetCurrent(&prev); r != Success {
		return r
	}
	if prev != d.ctx {
		if r := a.cuCtxSetCurrent(d.ctx); r != Success {
			return r
		}
		defer a.cuCtxSetCurrent(prev)
	}
	return f(a)
}

// call runs one context-scoped driver call for a public method: it fails
// with ErrClosed after Close and turns a non-success code into an error
// naming op.
func (d *Device) call(op string, f func(a *api) Result) error {
	d.life.RLock()
	defer d.life.RUnlock()
	if d.closed {
		return ErrClosed
	}
	if r := d.withCtx(f); r != Success {
		return newError(d.api, op, r)
	}
	return nil
}

// Alloc allocates n bytes of device memory (cuMemAlloc: 256-byte aligned,
// not initialized).
func (d *Device) Alloc(n int) (DevicePtr, error) {
	if n <= 0 {
		return 0, errors.Newf("cuda driver: Alloc(%d): size must be positive", n)
	}
	var p uint64
	err := d.call("cuMemAlloc", func(a *api) Result { return a.cuMemAlloc(&p, uintptr(n)) })
	if err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// Free releases memory returned by Alloc. It synchronizes with the device
// (cuMemFree waits for work that may still use the memory).
func (d *Device) Free(p DevicePtr) error {
	return d.call("cuMemFree", func(a *api) Result { return a.cuMemFree(uint64(p)) })
}

// CopyHtoD copies src to device address dst. It is ordered after work on the
// legacy default stream (and so after blocking streams, see NewStream), and
// src may be reused when it returns.
func (d *Device) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	err := d.call("cuMemcpyHtoD", func(a *api) Result {
		return a.cuMemcpyHtoD(uint64(dst), unsafe.Pointer(&src[0]), uintptr(len(src)))
	})
	runtime.KeepAlive(src)
	return err
}

// CopyDtoH copies len(dst) bytes from device address src into dst and
// returns when they are there.
func (d *Device) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	err := d.call("cuMemcpyDtoH", func(a *api) Result {
		return a.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), uint64(src), uintptr(len(dst)))
	})
	runtime.KeepAlive(dst)
	return err
}

// MemsetD8 sets n bytes at dst to v.
func (d *Device) MemsetD8(dst DevicePtr, v byte, n int) error {
	if n < 0 {
		return errors.Newf("cuda driver: MemsetD8 of %d bytes", n)
	}
	return d.call("cuMemsetD8", func(a *api) Result { return a.cuMemsetD8(uint64(dst), v, uintptr(n)) })
}

// Stats are counters for tests and metrics.
type Stats struct {
	// EventsCreated counts cuEventCreate calls; Record reuses abandoned
	// events, so in steady state it stops growing.
	EventsCreated uint64
	// EventsLive is the number of CUevents that exist (in use or free).
	EventsLive int
	// EventsFree is the number of CUevents ready for reuse.
	EventsFree int
}

// Stats returns the device's counters.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Stats{EventsCreated: d.created, EventsLive: len(d.events), EventsFree: len(d.free)}
}
