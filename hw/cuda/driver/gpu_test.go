package driver

// Tests and benchmarks on a real GPU. They skip with "no CUDA driver: ..."
// where Open(0) fails. scripts/gpu-check.sh builds and runs them.

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One device for the whole run: retaining and releasing the primary context
// per test would re-create it (hundreds of ms each).
var (
	gpuOnce sync.Once
	gpuDev  *Device
	gpuErr  error
)

func gpu(tb testing.TB) *Device {
	tb.Helper()
	gpuOnce.Do(func() { gpuDev, gpuErr = Open(0) })
	if gpuErr != nil {
		tb.Skipf("no CUDA driver: %v", gpuErr)
	}
	return gpuDev
}

// closeGPU runs after all tests, before the leak check.
func closeGPU() error {
	if gpuDev == nil {
		return nil
	}
	return gpuDev.Close()
}

// allocOrSkip allocates n bytes or skips on a device too small for the test.
func allocOrSkip(t testing.TB, d *Device, n int) DevicePtr {
	t.Helper()
	p, err := d.Alloc(n)
	if code, ok := Code(err); ok && code == 2 {
		t.Skipf("device too small: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Free(p)) })
	return p
}

func TestGPUInfo(t *testing.T) {
	d := gpu(t)
	t.Logf("GPU found: %s (device %d)", d.Name(), d.Ordinal())
}

// childEnv marks the test binary re-executed by TestCFakeLibcuda over a fake
// libcuda.so.1 that really copies host memory: the GPU tests use smaller
// buffers there.
const childEnv = "KVSTREAM_FAKECUDA_CHILD"

// longCopyBytes is the buffer size of longCopy.
var longCopyBytes = 1 << 30

func init() {
	if os.Getenv(childEnv) != "" {
		longCopyBytes = 64 << 20
	}
}

// longCopy enqueues 8 device-to-device copies of longCopyBytes on s (8 GiB:
// several ms on any GPU, about 4 ms on an H200), after filling src with v.
func longCopy(t *testing.T, d *Device, s *Stream, v byte) (dst DevicePtr, n int) {
	t.Helper()
	n = longCopyBytes
	src := allocOrSkip(t, d, n)
	dst = allocOrSkip(t, d, n)
	require.NoError(t, s.MemsetD8Async(src, v, n))
	for range 8 {
		require.NoError(t, s.CopyDtoDAsync(dst, src, n))
	}
	return dst, n
}

func TestGPUEventAfterLongCopyCompletesOnlyAfterIt(t *testing.T) {
	d := gpu(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Synchronize())

	dst, n := longCopy(t, d, s, 0x5A)
	ev, err := s.Record()
	require.NoError(t, err)
	recorded := time.Now()
	ok, err := ev.Query()
	require.NoError(t, err)
	assert.False(t, ok, "event must not be complete right after Record behind 8 long copies")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, ev.Wait(ctx))
	t.Logf("8 copies of %d MiB completed %v after Record", n>>20, time.Since(recorded))
	ok, err = ev.Query()
	require.NoError(t, err)
	assert.True(t, ok)

	head := make([]byte, 4096)
	tail := make([]byte, 4096)
	require.NoError(t, d.CopyDtoH(head, dst))
	require.NoError(t, d.CopyDtoH(tail, dst+DevicePtr(n-len(tail))))
	assert.Equal(t, bytes.Repeat([]byte{0x5A}, 4096), head)
	assert.Equal(t, bytes.Repeat([]byte{0x5A}, 4096), tail)
}

func TestGPUWaitFromOtherGoroutinesAndCancel(t *testing.T) {
	d := gpu(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	longCopy(t, d, s, 1)
	ev, err := s.Record()
	require.NoError(t, err)

	// A short deadline ends Wait while the GPU is still copying.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Microsecond)
	start := time.Now()
	err = ev.Wait(ctx)
	cancel()
	took := time.Since(start)
	if ok, _ := ev.Query(); !ok {
		require.Error(t, err)
		assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
		assert.Less(t, took, 50*time.Millisecond, "Wait returned late after its deadline")
	}

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			assert.NoError(t, ev.Wait(ctx))
			ok, err := ev.Query()
			assert.NoError(t, err)
			assert.True(t, ok)
		}()
	}
	wg.Wait()
}

func TestGPUManyEvents(t *testing.T) {
	d := gpu(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	buf := allocOrSkip(t, d, 64<<20)

	const n = 10_000
	run := func() {
		evs := make([]*Event, 0, n)
		notReady := 0
		for i := range n {
			if i%100 == 0 { // some real work, so that some events are pending
				require.NoError(t, s.MemsetD8Async(buf, byte(i), 64<<20))
			}
			ev, err := s.RecordEvent()
			require.NoError(t, err)
			ok, err := ev.Query()
			require.NoError(t, err)
			if !ok {
				notReady++
			}
			evs = append(evs, ev)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, ev := range evs {
			require.NoError(t, ev.Wait(ctx))
		}
		t.Logf("%d events, %d not ready when first queried", n, notReady)
	}
	run()
	first := d.Stats()
	deadline := time.Now().Add(10 * time.Second)
	for d.Stats().EventsFree < maxFreeEvents/2 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	run()
	st := d.Stats()
	t.Logf("stats after first run %+v, after second %+v", first, st)
	assert.Less(t, st.EventsCreated-first.EventsCreated, uint64(n), "the second run must reuse freed events")
}

func TestGPUMemoryRoundTrip(t *testing.T) {
	d := gpu(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	const n = 64 << 20
	a := allocOrSkip(t, d, n)
	b := allocOrSkip(t, d, n)
	src := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			src[i+j] = byte(v >> (8 * j))
		}
	}
	require.NoError(t, d.CopyHtoD(a, src))
	require.NoError(t, d.MemsetD8(b, 0, n))
	const off = 1 << 20
	require.NoError(t, s.CopyDtoDAsync(b, a+off, n-off))
	require.NoError(t, s.MemsetD8Async(b+n-off, 0xC3, off))
	ev, err := s.Record()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, ev.Wait(ctx))
	got := make([]byte, n)
	require.NoError(t, d.CopyDtoH(got, b))
	assert.True(t, bytes.Equal(src[off:], got[:n-off]), "DtoD copy differs")
	assert.Equal(t, bytes.Repeat([]byte{0xC3}, off), got[n-off:])
}

// Driver calls from goroutines that never touched CUDA, and from a locked
// thread that has no context current, work; that thread still has none
// afterwards.
func TestGPUContextFromFreshThreads(t *testing.T) {
	d := gpu(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()

	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if !assert.Equal(t, Success, d.api.cuCtxSetCurrent(0)) {
			return
		}
		ev, err := s.Record()
		if !assert.NoError(t, err) {
			return
		}
		assert.NoError(t, ev.Wait(context.Background()))
		var cur uintptr
		assert.Equal(t, Success, d.api.cuCtxGetCurrent(&cur))
		assert.Zero(t, cur, "the thread's (absent) context must be restored")
	}()
	<-done

	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev, err := s.Record()
			if assert.NoError(t, err) {
				assert.NoError(t, ev.Wait(context.Background()))
			}
		}()
	}
	wg.Wait()
}

// BenchmarkRecord is the cost of one event record, the only driver call on
// the forward thread at a group boundary.
func BenchmarkRecord(b *testing.B) {
	d := gpu(b)
	s, err := d.NewStream()
	require.NoError(b, err)
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Record(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	require.NoError(b, s.Synchronize())
}

// BenchmarkQuery is the cost of one cuEventQuery through the wrapper (the
// completion cache bypassed), a submitter's polling step.
func BenchmarkQuery(b *testing.B) {
	d := gpu(b)
	s, err := d.NewStream()
	require.NoError(b, err)
	defer s.Close()
	ev, err := s.RecordEvent()
	require.NoError(b, err)
	require.NoError(b, ev.Wait(context.Background()))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ev.query(); err != nil {
			b.Fatal(err)
		}
	}
}
