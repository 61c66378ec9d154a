package driver

import (
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// LibraryName is the file the package opens: the soname the NVIDIA driver
// installs (the unversioned libcuda.so comes only with the toolkit and may
// be a stub).
const LibraryName = "libcuda.so.1"

// Markers for Open's failures, so that callers can fall back to the
// simulator (errors.Is).
var (
	// ErrNoDriver: libcuda.so.1 cannot be loaded or initialized (no NVIDIA
	// driver, a stub library, a driver/runtime mismatch, an unsupported OS).
	ErrNoDriver = errors.New("cuda driver: no usable CUDA driver")
	// ErrNoDevice: the driver works but the requested device does not exist
	// or cannot be used.
	ErrNoDevice = errors.New("cuda driver: no such CUDA device")
	// ErrClosed: the Device (or the Stream) was closed.
	ErrClosed = errors.New("cuda driver: closed")
)

// api is the table of driver entry points. Every driver call goes through
// it, so tests replace it with Go fakes and exercise the context discipline,
// NOT_READY handling and cancellation without a GPU. Signatures follow
// cuda.h; handles (CUcontext, CUstream, CUevent) are pointers in C and
// uintptr here, CUdevice is int, CUdeviceptr is unsigned long long (the _v2
// ABI), size_t is uintptr.
type api struct {
	cuInit                    func(flags uint32) Result
	cuDeviceGetCount          func(count *int32) Result
	cuDeviceGet               func(dev *int32, ordinal int32) Result
	cuDeviceGetName           func(name *byte, n int32, dev int32) Result
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) Result
	cuDevicePrimaryCtxRelease func(dev int32) Result
	cuCtxSetCurrent           func(ctx uintptr) Result
	cuCtxGetCurrent           func(ctx *uintptr) Result
	cuStreamCreate            func(stream *uintptr, flags uint32) Result
	cuStreamDestroy           func(stream uintptr) Result
	cuStreamSynchronize       func(stream uintptr) Result
	cuEventCreate             func(event *uintptr, flags uint32) Result
	cuEventDestroy            func(event uintptr) Result
	cuEventRecord             func(event, stream uintptr) Result
	cuEventQuery              func(event uintptr) Result
	cuEventSynchronize        func(event uintptr) Result
	cuMemAlloc                func(ptr *uint64, size uintptr) Result
	cuMemFree                 func(ptr uint64) Result
	cuMemcpyHtoD              func(dst uint64, src unsafe.Pointer, size uintptr) Result
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uint64, size uintptr) Result
	cuMemcpyDtoDAsync         func(dst, src uint64, size uintptr, stream uintptr) Result
	cuMemsetD8                func(dst uint64, value uint8, n uintptr) Result
	cuMemsetD8Async           func(dst uint64, value uint8, n uintptr, stream uintptr) Result
	cuGetErrorName            func(r Result, str **byte) Result
	cuGetErrorString          func(r Result, str **byte) Result
}

// symbols maps each table entry to the exported symbol that implements it.
// The _v2 names are what cuda.h's #defines resolve to since CUDA 4.0/11.0
// (64-bit CUdeviceptr, primary context release that does not reset); the
// plain names of those functions are the legacy ABI and must not be used.
// Plain (not _ptds/_ptsz) names give legacy default-stream semantics, which
// is what a 0 stream handle means in WrapStream.
func (a *api) symbols() []struct {
	name string
	fn   any
} {
	return []struct {
		name string
		fn   any
	}{
		{"cuInit", &a.cuInit},
		{"cuDeviceGetCount", &a.cuDeviceGetCount},
		{"cuDeviceGet", &a.cuDeviceGet},
		{"cuDeviceGetName", &a.cuDeviceGetName},
		{"cuDevicePrimaryCtxRetain", &a.cuDevicePrimaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &a.cuDevicePrimaryCtxRelease},
		{"cuCtxSetCurrent", &a.cuCtxSetCurrent},
		{"cuCtxGetCurrent", &a.cuCtxGetCurrent},
		{"cuStreamCreate", &a.cuStreamCreate},
		{"cuStreamDestroy_v2", &a.cuStreamDestroy},
		{"cuStreamSynchronize", &a.cuStreamSynchronize},
		{"cuEventCreate", &a.cuEventCreate},
		{"cuEventDestroy_v2", &a.cuEventDestroy},
		{"cuEventRecord", &a.cuEventRecord},
		{"cuEventQuery", &a.cuEventQuery},
		{"cuEventSynchronize", &a.cuEventSynchronize},
		{"cuMemAlloc_v2", &a.cuMemAlloc},
		{"cuMemFree_v2", &a.cuMemFree},
		{"cuMemcpyHtoD_v2", &a.cuMemcpyHtoD},
		{"cuMemcpyDtoH_v2", &a.cuMemcpyDtoH},
		{"cuMemcpyDtoDAsync_v2", &a.cuMemcpyDtoDAsync},
		{"cuMemsetD8_v2", &a.cuMemsetD8},
		{"cuMemsetD8Async", &a.cuMemsetD8Async},
		{"cuGetErrorName", &a.cuGetErrorName},
		{"cuGetErrorString", &a.cuGetErrorString},
	}
}

// errorName asks the driver for a code's name; "" when it cannot say.
func (a *api) errorName(r Result) string {
	if a.cuGetErrorName == nil {
		return ""
	}
	var p *byte
	if a.cuGetErrorName(r, &p) != Success {
		return ""
	}
	return goString(p)
}

// errorString asks the driver for a code's description; "" when it cannot
// say.
func (a *api) errorString(r Result) string {
	if a.cuGetErrorString == nil {
		return ""
	}
	var p *byte
	if a.cuGetErrorString(r, &p) != Success {
		return ""
	}
	return goString(p)
}

// goString copies a NUL-terminated C string (static driver memory) into Go
// memory.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

var (
	loadOnce sync.Once
	loaded   *api
	loadErr  error
)

// load opens and initializes the driver once per process: dlopen and cuInit
// are process-wide, and a failed cuInit keeps failing, so there is nothing
// to gain from retrying.
func load() (*api, error) {
	loadOnce.Do(func() {
		a, err := loadLibrary(LibraryName)
		if err == nil {
			err = initDriver(a)
		}
		if err != nil {
			a = nil
		}
		loaded, loadErr = a, err
	})
	return loaded, loadErr
}

// initDriver runs cuInit and sorts its failure: no device (the driver
// works, the machine has no GPU or CUDA_VISIBLE_DEVICES hides them all) or
// no usable driver (stub library, version mismatch, ...).
func initDriver(a *api) error {
	r := a.cuInit(0)
	if r == Success {
		return nil
	}
	err := newError(a, "cuInit", r)
	if r == ErrorNoDevice {
		return errors.Mark(errors.Wrap(err, "cuda driver: no CUDA device present"), ErrNoDevice)
	}
	return errors.Mark(errors.Wrap(err, "cuda driver: initializing "+LibraryName), ErrNoDriver)
}
