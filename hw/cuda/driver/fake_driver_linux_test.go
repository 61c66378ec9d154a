package driver

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func openFake(t testing.TB) (*fakeGPU, *Device) {
	t.Helper()
	g := newFakeGPU()
	d, err := open(g.api(), 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return g, d
}

func TestFakeOpenDeviceChecks(t *testing.T) {
	g := newFakeGPU()
	_, err := open(g.api(), 3)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoDevice))
	assert.Contains(t, err.Error(), "cuda driver: device 3 requested but 1 device(s) present")
	_, err = open(g.api(), -1)
	assert.True(t, errors.Is(err, ErrNoDevice))

	g.count = 0
	_, err = open(g.api(), 0)
	assert.True(t, errors.Is(err, ErrNoDevice))
	assert.Contains(t, err.Error(), "no CUDA device present")

	g = newFakeGPU()
	g.setFail("cuDevicePrimaryCtxRetain", 46)
	_, err = open(g.api(), 0)
	assert.True(t, errors.Is(err, ErrNoDevice))
	assert.Contains(t, err.Error(), "cuDevicePrimaryCtxRetain: CUDA_ERROR_DEVICE_UNAVAILABLE (46)")

	g = newFakeGPU()
	d, err := open(g.api(), 0)
	require.NoError(t, err)
	assert.Equal(t, "Fake GPU", d.Name())
	assert.Equal(t, 0, d.Ordinal())
	assert.Equal(t, g.primary, d.Context())
	assert.Equal(t, 1, g.retains)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close())
	assert.Equal(t, 0, g.retains, "primary context released exactly once")
}

func TestFakeInitFailureIsSorted(t *testing.T) {
	a := newFakeGPU().api()
	a.cuInit = func(uint32) Result { return ErrorNoDevice }
	err := initDriver(a)
	assert.True(t, errors.Is(err, ErrNoDevice))
	assert.False(t, errors.Is(err, ErrNoDriver))
	assert.Contains(t, err.Error(), "cuInit: CUDA_ERROR_NO_DEVICE (100)")

	a.cuInit = func(uint32) Result { return 34 } // stub library
	err = initDriver(a)
	assert.True(t, errors.Is(err, ErrNoDriver))
	assert.Contains(t, err.Error(), "CUDA_ERROR_STUB_LIBRARY (34)")
}

func TestFakeErrorNamesComeFromDriverFirst(t *testing.T) {
	g := newFakeGPU()
	err := newError(g.api(), "cuEventRecord", 4242)
	assert.Equal(t, "cuEventRecord: CUDA_ERROR_FROM_FAKE_DRIVER (4242)", err.Error())
	// The driver does not know 400: the table names it.
	err = newError(g.api(), "cuEventRecord", 400)
	assert.Equal(t, "cuEventRecord: CUDA_ERROR_INVALID_HANDLE (400)", err.Error())
}

// Every driver call must find the primary context current on the OS thread
// that makes it, whatever goroutine and thread the caller is on. The fake
// checks the context per thread on each call and yields inside
// cuCtxSetCurrent, so a wrapper that did not lock the thread would be
// caught moving between set and call.
func TestFakeContextCurrentOnEveryCallFromFreshGoroutines(t *testing.T) {
	g, d := openFake(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	buf, err := d.Alloc(1 << 10)
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 30 {
				if err := func() error {
					ev, err := s.Record()
					if err != nil {
						return err
					}
					if _, err := ev.Query(); err != nil {
						return err
					}
					if err := ev.Wait(context.Background()); err != nil {
						return err
					}
					if err := s.MemsetD8Async(buf, byte(i+j), 1<<10); err != nil {
						return err
					}
					h := make([]byte, 8)
					if err := d.CopyDtoH(h, buf); err != nil {
						return err
					}
					return s.Synchronize()
				}(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Zero(t, g.wrongCtx.Load(), "calls ran without the primary context current")
	require.NoError(t, d.Free(buf))
	require.NoError(t, s.Close())
}

// A serving stack that keeps its own context current on its locked forward
// thread must find it there after calling us; a thread that already has the
// primary context current pays no cuCtxSetCurrent.
func TestFakeContextRestoredAndNotSwitchedNeedlessly(t *testing.T) {
	g, d := openFake(t)
	s := d.WrapStream(0)

	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		const theirs = uintptr(0xBEEF)
		g.mu.Lock()
		g.current[tid()] = theirs
		g.mu.Unlock()
		_, err := s.Record()
		assert.NoError(t, err)
		assert.Equal(t, theirs, g.currentOnThisThread(), "caller's context must be restored")

		g.mu.Lock()
		g.current[tid()] = g.primary
		g.mu.Unlock()
		before := g.setCurrent.Load()
		ev, err := s.Record()
		assert.NoError(t, err)
		_, err = ev.Query()
		assert.NoError(t, err)
		assert.Equal(t, before, g.setCurrent.Load(), "no context switch when the primary context is current")
		assert.Equal(t, g.primary, g.currentOnThisThread())
	}()
	<-done
	assert.Zero(t, g.wrongCtx.Load())
}

func TestFakeQueryNotReadyThenDone(t *testing.T) {
	g, d := openFake(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	g.block(s.Handle())
	ev, err := s.Record()
	require.NoError(t, err)

	ok, err := ev.Query()
	require.NoError(t, err, "CUDA_ERROR_NOT_READY is not an error")
	assert.False(t, ok)

	g.release(s.Handle())
	ok, err = ev.Query()
	require.NoError(t, err)
	assert.True(t, ok)

	// Completion is sticky: later queries and waits do not call the driver.
	n := g.queries.Load()
	ok, err = ev.Query()
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, ev.Wait(context.Background()))
	assert.Equal(t, n, g.queries.Load())
	require.NoError(t, ev.(*Event).Synchronize())
}

func TestFakeQueryErrors(t *testing.T) {
	g, d := openFake(t)
	s := d.WrapStream(0)
	ev, err := s.Record()
	require.NoError(t, err)

	g.setFail("cuEventQuery", 700)
	ok, err := ev.Query()
	assert.False(t, ok)
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost))
	assert.Contains(t, err.Error(), "cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS (700)")
	assert.Error(t, ev.Wait(context.Background()))

	g.setFail("cuEventQuery", ErrorInvalidValue)
	_, err = ev.Query()
	require.Error(t, err)
	assert.False(t, errors.Is(err, cuda.ErrDeviceLost))

	g.setFail("cuEventRecord", 719)
	live := g.liveEvents()
	ev2, err := s.Record()
	assert.Equal(t, live, g.liveEvents(), "the event of a failed Record is destroyed, not reused")
	require.Error(t, err)
	assert.Nil(t, ev2, "a failed Record must return a nil interface")
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost))
	assert.Contains(t, err.Error(), "cuEventRecord: CUDA_ERROR_LAUNCH_FAILED (719)")

	g.setFail("cuEventRecord", Success)
	g.setFail("cuEventCreate", 2)
	d.mu.Lock()
	d.free = nil // force a create
	d.mu.Unlock()
	_, err = s.Record()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cuEventCreate: CUDA_ERROR_OUT_OF_MEMORY (2)")
}

func TestFakeWaitHonoursContext(t *testing.T) {
	g, d := openFake(t)
	s := d.WrapStream(0)
	g.block(0)
	ev, err := s.Record()
	require.NoError(t, err)

	// Deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	start := time.Now()
	err = ev.Wait(ctx)
	cancel()
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded))
	assert.Less(t, time.Since(start), 2*time.Second)

	// Cancellation while polling.
	ctx, cancel = context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- ev.Wait(ctx) }()
	time.Sleep(5 * time.Millisecond)
	cancelled := time.Now()
	cancel()
	select {
	case err := <-res:
		assert.True(t, errors.Is(err, context.Canceled))
		// One backoff step (plus Go timer slack) at most.
		assert.Less(t, time.Since(cancelled), 500*time.Millisecond)
	case <-time.After(5 * time.Second):
		t.Fatal("Wait ignored cancellation")
	}

	// Already-cancelled context on a pending event fails at once.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	assert.True(t, errors.Is(ev.Wait(ctx), context.Canceled))

	// Completion while waiting, from several goroutines.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			assert.NoError(t, ev.Wait(ctx))
		}()
	}
	time.Sleep(5 * time.Millisecond)
	g.release(0)
	wg.Wait()
}

func TestFakeWaitReturnsDeviceError(t *testing.T) {
	g, d := openFake(t)
	s := d.WrapStream(0)
	g.block(0)
	ev, err := s.Record()
	require.NoError(t, err)
	go func() {
		time.Sleep(2 * time.Millisecond)
		g.setFail("cuEventQuery", 719)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = ev.Wait(ctx)
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost))
	assert.False(t, errors.Is(err, context.DeadlineExceeded))
}

// Events the engine drops are recycled: after GC the handles come back and
// Record stops creating driver events.
func TestFakeEventsAreRecycled(t *testing.T) {
	g, d := openFake(t)
	s := d.WrapStream(0)
	for range 100 {
		_, err := s.Record()
		require.NoError(t, err)
	}
	assert.Equal(t, uint64(100), d.Stats().EventsCreated)

	deadline := time.Now().Add(10 * time.Second)
	for d.Stats().EventsFree < 100 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, 100, d.Stats().EventsFree, "cleanups did not return the events")

	keep := make([]cuda.Event, 0, 100)
	for range 100 {
		ev, err := s.Record()
		require.NoError(t, err)
		keep = append(keep, ev)
	}
	assert.Equal(t, uint64(100), d.Stats().EventsCreated, "recorded events must reuse freed handles")
	assert.Equal(t, int64(100), g.creates.Load())
	for _, ev := range keep {
		ok, err := ev.Query()
		require.NoError(t, err)
		assert.True(t, ok)
	}
	runtime.KeepAlive(keep)
}

func TestFakeFreeListIsBounded(t *testing.T) {
	g, d := openFake(t)
	h := make([]uintptr, 0, maxFreeEvents+10)
	d.life.RLock()
	for range maxFreeEvents + 10 {
		var e uintptr
		require.Equal(t, Success, d.withCtx(func(a *api) Result { return a.cuEventCreate(&e, eventFlags) }))
		d.mu.Lock()
		d.events[e] = struct{}{}
		d.mu.Unlock()
		h = append(h, e)
	}
	for _, e := range h {
		d.putFree(e)
	}
	d.life.RUnlock()
	st := d.Stats()
	assert.Equal(t, maxFreeEvents, st.EventsFree)
	assert.Equal(t, maxFreeEvents, st.EventsLive)
	assert.Equal(t, maxFreeEvents, g.liveEvents(), "events beyond the bound are destroyed")
}

func TestFakeCloseReleasesEverything(t *testing.T) {
	g := newFakeGPU()
	d, err := open(g.api(), 0)
	require.NoError(t, err)
	owned, err := d.NewStream()
	require.NoError(t, err)
	closedEarly, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, closedEarly.Close())
	require.NoError(t, closedEarly.Close())
	assert.False(t, g.hasStream(closedEarly.Handle()))

	foreign, err := d.NewStream() // stands for a stack-owned stream
	require.NoError(t, err)
	wrapped := d.WrapStream(foreign.Handle())
	ev, err := wrapped.Record()
	require.NoError(t, err)
	require.NoError(t, wrapped.Close())
	assert.True(t, g.hasStream(foreign.Handle()), "a wrapper must not destroy a stream it does not own")
	_, err = wrapped.Record()
	assert.True(t, errors.Is(err, ErrClosed))

	ev2, err := owned.Record()
	require.NoError(t, err)
	g.block(owned.Handle())
	ev3, err := owned.Record()
	require.NoError(t, err)

	require.NoError(t, d.Close())
	assert.Equal(t, 0, g.liveEvents(), "Close destroys every event, in use or free")
	assert.False(t, g.hasStream(owned.Handle()))
	assert.False(t, g.hasStream(foreign.Handle()))
	assert.Equal(t, 0, g.retains)
	assert.Zero(t, g.wrongCtx.Load())

	_, err = ev3.Query()
	assert.True(t, errors.Is(err, ErrClosed))
	assert.True(t, errors.Is(ev3.Wait(context.Background()), ErrClosed))
	_, err = owned.Record()
	assert.True(t, errors.Is(err, ErrClosed))
	_, err = d.NewStream()
	assert.True(t, errors.Is(err, ErrClosed))
	_, err = d.Alloc(10)
	assert.True(t, errors.Is(err, ErrClosed))
	require.NoError(t, owned.Close())
	runtime.KeepAlive(ev)
	runtime.KeepAlive(ev2)

	// Cleanups of events that die after Close must not touch the driver.
	ev, ev2, ev3 = nil, nil, nil
	runtime.GC()
	runtime.GC()
}

func TestFakeMemoryRoundTrip(t *testing.T) {
	g, d := openFake(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	const n = 1 << 16
	a, err := d.Alloc(n)
	require.NoError(t, err)
	b, err := d.Alloc(n)
	require.NoError(t, err)
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 7)
	}
	require.NoError(t, d.CopyHtoD(a, src))
	require.NoError(t, d.MemsetD8(b, 0xEE, n))
	require.NoError(t, s.CopyDtoDAsync(b+16, a, n-16))
	ev, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, ev.Wait(context.Background()))
	got := make([]byte, n)
	require.NoError(t, d.CopyDtoH(got, b))
	assert.Equal(t, []byte{0xEE, 0xEE}, got[:2])
	assert.True(t, bytes.Equal(src[:n-16], got[16:]))
	require.NoError(t, d.Free(a))
	require.NoError(t, d.Free(b))
	err = d.Free(a)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cuMemFree: CUDA_ERROR_INVALID_VALUE (1)")
	_, err = d.Alloc(0)
	assert.Error(t, err)
	assert.Zero(t, g.wrongCtx.Load())
}

// benchAPI is a driver that does nothing, so that the benchmarks below
// measure the wrapper alone: locking the thread, the context check (and
// switch and restore when switch is set), Close ordering, the event pool.
func benchAPI(switchCtx bool) *api {
	a := newFakeGPU().api()
	cur := uintptr(0xC0)
	if switchCtx {
		cur = 0
	}
	a.cuCtxGetCurrent = func(ctx *uintptr) Result { *ctx = cur; return Success }
	a.cuCtxSetCurrent = func(uintptr) Result { return Success }
	next := uintptr(0)
	a.cuEventCreate = func(e *uintptr, _ uint32) Result { next++; *e = next; return Success }
	a.cuEventDestroy = func(uintptr) Result { return Success }
	a.cuEventRecord = func(_, _ uintptr) Result { return Success }
	a.cuEventQuery = func(uintptr) Result { return Success }
	return a
}

// The wrapper's own cost per Record and per driver query, with the primary
// context already current on the thread and with a switch and restore.
func BenchmarkWrapperRecord(b *testing.B) {
	for _, sw := range []bool{false, true} {
		b.Run(map[bool]string{false: "current", true: "switch"}[sw], func(b *testing.B) {
			d, err := open(benchAPI(sw), 0)
			require.NoError(b, err)
			defer d.Close()
			s := d.WrapStream(0)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Record(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkWrapperQuery(b *testing.B) {
	for _, sw := range []bool{false, true} {
		b.Run(map[bool]string{false: "current", true: "switch"}[sw], func(b *testing.B) {
			d, err := open(benchAPI(sw), 0)
			require.NoError(b, err)
			defer d.Close()
			ev, err := d.WrapStream(0).RecordEvent()
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ev.query(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
