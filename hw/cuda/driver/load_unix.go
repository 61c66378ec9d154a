//go:build darwin || freebsd || linux || netbsd

package driver

import (
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/ebitengine/purego"
)

// loadLibrary dlopens path and binds every entry point of the table. The
// handle is never closed on success: the driver keeps process-wide state
// and unloading it under live contexts is unsafe.
func loadLibrary(path string) (*api, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, errors.Mark(errors.Wrapf(err, "cuda driver: %s not found or not loadable", path), ErrNoDriver)
	}
	a := &api{}
	syms := make(map[string]uintptr)
	for _, s := range a.symbols() {
		// Dlsym first: RegisterLibFunc panics on a missing symbol, and an
		// old driver lacking one must be an error, not a crash.
		sym, err := purego.Dlsym(h, s.name)
		if err != nil {
			_ = purego.Dlclose(h)
			return nil, errors.Mark(errors.Wrapf(err, "cuda driver: %s lacks %s (driver too old?)", path, s.name), ErrNoDriver)
		}
		purego.RegisterFunc(s.fn, sym)
		syms[s.name] = sym
	}
	bindHotPaths(a, syms)
	return a, nil
}

// bindHotPaths rebinds the calls made on every Record and Query with
// purego.SyscallN. RegisterFunc's wrappers go through reflect.MakeFunc and
// cost about 1 µs and several allocations per call, and a Record or Query
// makes two to four of these calls (context check, switch and restore);
// SyscallN passes integer arguments straight to the C ABI for a fraction of
// that. CUresult is a 32-bit enum: only the low half of the return register
// is defined.
func bindHotPaths(a *api, syms map[string]uintptr) {
	getCurrent := syms["cuCtxGetCurrent"]
	a.cuCtxGetCurrent = func(ctx *uintptr) Result {
		r, _, _ := purego.SyscallN(getCurrent, uintptr(unsafe.Pointer(ctx)))
		return Result(int32(r))
	}
	setCurrent := syms["cuCtxSetCurrent"]
	a.cuCtxSetCurrent = func(ctx uintptr) Result {
		r, _, _ := purego.SyscallN(setCurrent, ctx)
		return Result(int32(r))
	}
	record := syms["cuEventRecord"]
	a.cuEventRecord = func(event, stream uintptr) Result {
		r, _, _ := purego.SyscallN(record, event, stream)
		return Result(int32(r))
	}
	query := syms["cuEventQuery"]
	a.cuEventQuery = func(event uintptr) Result {
		r, _, _ := purego.SyscallN(query, event)
		return Result(int32(r))
	}
}
