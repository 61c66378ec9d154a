package driver

import (
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// fakeGPU is a driver function table backed by Go maps. It models what the
// package relies on: a context current per OS thread (checked by every
// context-scoped call, like the real driver), streams whose recorded events
// stay NOT_READY while the stream is blocked, device memory, and injectable
// error codes.
type fakeGPU struct {
	mu      sync.Mutex
	count   int32                   // devices
	primary uintptr                 // the primary context handle
	current map[int]uintptr         // OS thread id -> current context
	next    uintptr                 // handle allocator
	streams map[uintptr]*fakeStream // 0 (legacy default stream) is implicit
	events  map[uintptr]*fakeEvent
	mem     map[uint64][]byte
	fail    map[string]Result // op -> code its next calls return
	retains int
	noYield bool // benchmarks: skip the Gosched in cuCtxSetCurrent

	wrongCtx   atomic.Int64 // context-scoped calls made without the primary context current
	setCurrent atomic.Int64 // cuCtxSetCurrent calls
	queries    atomic.Int64 // cuEventQuery calls
	creates    atomic.Int64 // cuEventCreate calls
}

type fakeStream struct {
	blocked bool
}

type fakeEvent struct {
	stream  uintptr
	pending bool
	flags   uint32
}

func newFakeGPU() *fakeGPU {
	return &fakeGPU{
		count:   1,
		primary: 0xC0,
		current: make(map[int]uintptr),
		next:    0x1000,
		streams: map[uintptr]*fakeStream{0: {}},
		events:  make(map[uintptr]*fakeEvent),
		mem:     make(map[uint64][]byte),
		fail:    make(map[string]Result),
	}
}

func tid() int { return syscall.Gettid() }

// enter checks the calling thread's context and any injected failure for op.
// Callers hold g.mu.
func (g *fakeGPU) enter(op string) Result {
	if g.current[tid()] != g.primary {
		g.wrongCtx.Add(1)
		return 201 // CUDA_ERROR_INVALID_CONTEXT, as the real driver says
	}
	if r, ok := g.fail[op]; ok {
		return r
	}
	return Success
}

func (g *fakeGPU) setFail(op string, r Result) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r == Success {
		delete(g.fail, op)
	} else {
		g.fail[op] = r
	}
}

// block makes events recorded on stream pending until release(stream).
func (g *fakeGPU) block(stream uintptr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.streams[stream].blocked = true
}

func (g *fakeGPU) release(stream uintptr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.streams[stream].blocked = false
	for _, e := range g.events {
		if e.stream == stream {
			e.pending = false
		}
	}
}

func (g *fakeGPU) liveEvents() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.events)
}

func (g *fakeGPU) hasStream(h uintptr) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.streams[h]
	return ok
}

func (g *fakeGPU) currentOnThisThread() uintptr {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.current[tid()]
}

func (g *fakeGPU) handle() uintptr {
	g.next += 0x10
	return g.next
}

// memAt finds the allocation holding [p, p+n).
func (g *fakeGPU) memAt(p uint64, n uintptr) ([]byte, bool) {
	for base, b := range g.mem {
		if p >= base && p+uint64(n) <= base+uint64(len(b)) {
			return b[p-base : p-base+uint64(n)], true
		}
	}
	return nil, false
}

var fakeNames = map[Result]string{4242: "CUDA_ERROR_FROM_FAKE_DRIVER"}

func (g *fakeGPU) api() *api {
	lock := func() func() { g.mu.Lock(); return g.mu.Unlock }
	return &api{
		cuInit: func(uint32) Result { return Success },
		cuDeviceGetCount: func(c *int32) Result {
			defer lock()()
			*c = g.count
			return g.fail["cuDeviceGetCount"]
		},
		cuDeviceGet: func(d *int32, ordinal int32) Result {
			*d = ordinal
			return Success
		},
		cuDeviceGetName: func(name *byte, n int32, _ int32) Result {
			b := unsafe.Slice(name, n)
			copy(b, "Fake GPU\x00")
			return Success
		},
		cuDevicePrimaryCtxRetain: func(ctx *uintptr, _ int32) Result {
			defer lock()()
			if r := g.fail["cuDevicePrimaryCtxRetain"]; r != Success {
				return r
			}
			g.retains++
			*ctx = g.primary
			return Success
		},
		cuDevicePrimaryCtxRelease: func(int32) Result {
			defer lock()()
			g.retains--
			return Success
		},
		cuCtxSetCurrent: func(ctx uintptr) Result {
			g.setCurrent.Add(1)
			g.mu.Lock()
			g.current[tid()] = ctx
			g.mu.Unlock()
			// Invite the scheduler to move the goroutine to another thread:
			// without LockOSThread the next call would often run where
			// this context is not current.
			if !g.noYield {
				runtime.Gosched()
			}
			return Success
		},
		cuCtxGetCurrent: func(ctx *uintptr) Result {
			defer lock()()
			*ctx = g.current[tid()]
			return Success
		},
		cuStreamCreate: func(s *uintptr, flags uint32) Result {
			defer lock()()
			if r := g.enter("cuStreamCreate"); r != Success {
				return r
			}
			h := g.handle()
			g.streams[h] = &fakeStream{}
			*s = h
			return Success
		},
		cuStreamDestroy: func(s uintptr) Result {
			defer lock()()
			if r := g.enter("cuStreamDestroy"); r != Success {
				return r
			}
			if _, ok := g.streams[s]; !ok || s == 0 {
				return 400
			}
			delete(g.streams, s)
			return Success
		},
		cuStreamSynchronize: func(s uintptr) Result {
			defer lock()()
			if r := g.enter("cuStreamSynchronize"); r != Success {
				return r
			}
			if _, ok := g.streams[s]; !ok {
				return 400
			}
			return Success
		},
		cuEventCreate: func(e *uintptr, flags uint32) Result {
			defer lock()()
			if r := g.enter("cuEventCreate"); r != Success {
				return r
			}
			g.creates.Add(1)
			h := g.handle()
			g.events[h] = &fakeEvent{flags: flags}
			*e = h
			return Success
		},
		cuEventDestroy: func(e uintptr) Result {
			defer lock()()
			if r := g.enter("cuEventDestroy"); r != Success {
				return r
			}
			if _, ok := g.events[e]; !ok {
				return 400
			}
			delete(g.events, e)
			return Success
		},
		cuEventRecord: func(e, s uintptr) Result {
			defer lock()()
			if r := g.enter("cuEventRecord"); r != Success {
				return r
			}
			ev, ok := g.events[e]
			st, ok2 := g.streams[s]
			if !ok || !ok2 {
				return 400
			}
			ev.stream, ev.pending = s, st.blocked
			return Success
		},
		cuEventQuery: func(e uintptr) Result {
			g.queries.Add(1)
			defer lock()()
			if r := g.enter("cuEventQuery"); r != Success {
				return r
			}
			ev, ok := g.events[e]
			if !ok {
				return 400
			}
			if ev.pending {
				return ErrorNotReady
			}
			return Success
		},
		cuEventSynchronize: func(e uintptr) Result {
			defer lock()()
			if r := g.enter("cuEventSynchronize"); r != Success {
				return r
			}
			if ev, ok := g.events[e]; !ok || ev.pending {
				return 400 // the fake cannot block; tests sync only completed events
			}
			return Success
		},
		cuMemAlloc: func(p *uint64, n uintptr) Result {
			defer lock()()
			if r := g.enter("cuMemAlloc"); r != Success {
				return r
			}
			h := uint64(g.handle()) << 32
			g.mem[h] = make([]byte, n)
			*p = h
			return Success
		},
		cuMemFree: func(p uint64) Result {
			defer lock()()
			if r := g.enter("cuMemFree"); r != Success {
				return r
			}
			if _, ok := g.mem[p]; !ok {
				return 1
			}
			delete(g.mem, p)
			return Success
		},
		cuMemcpyHtoD: func(dst uint64, src unsafe.Pointer, n uintptr) Result {
			defer lock()()
			if r := g.enter("cuMemcpyHtoD"); r != Success {
				return r
			}
			b, ok := g.memAt(dst, n)
			if !ok {
				return 1
			}
			copy(b, unsafe.Slice((*byte)(src), n))
			return Success
		},
		cuMemcpyDtoH: func(dst unsafe.Pointer, src uint64, n uintptr) Result {
			defer lock()()
			if r := g.enter("cuMemcpyDtoH"); r != Success {
				return r
			}
			b, ok := g.memAt(src, n)
			if !ok {
				return 1
			}
			copy(unsafe.Slice((*byte)(dst), n), b)
			return Success
		},
		cuMemcpyDtoDAsync: func(dst, src uint64, n uintptr, s uintptr) Result {
			defer lock()()
			if r := g.enter("cuMemcpyDtoDAsync"); r != Success {
				return r
			}
			d, ok1 := g.memAt(dst, n)
			sb, ok2 := g.memAt(src, n)
			if _, ok3 := g.streams[s]; !ok1 || !ok2 || !ok3 {
				return 1
			}
			copy(d, sb)
			return Success
		},
		cuMemsetD8: func(dst uint64, v uint8, n uintptr) Result {
			defer lock()()
			if r := g.enter("cuMemsetD8"); r != Success {
				return r
			}
			b, ok := g.memAt(dst, n)
			if !ok {
				return 1
			}
			for i := range b {
				b[i] = v
			}
			return Success
		},
		cuMemsetD8Async: func(dst uint64, v uint8, n uintptr, s uintptr) Result {
			defer lock()()
			if r := g.enter("cuMemsetD8Async"); r != Success {
				return r
			}
			b, ok := g.memAt(dst, n)
			if _, ok2 := g.streams[s]; !ok || !ok2 {
				return 1
			}
			for i := range b {
				b[i] = v
			}
			return Success
		},
		cuGetErrorName: func(r Result, s **byte) Result {
			n, ok := fakeNames[r]
			if !ok {
				*s = nil
				return ErrorInvalidValue
			}
			b := append([]byte(n), 0)
			*s = &b[0]
			return Success
		},
		cuGetErrorString: func(r Result, s **byte) Result {
			*s = nil
			return ErrorInvalidValue
		},
	}
}
