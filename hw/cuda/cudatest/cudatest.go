package cudatest

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stream is a stream under test with the two operations the contract needs
// beyond cuda.Stream.
type Stream interface {
	cuda.Stream
	// Launch enqueues a kernel whose work is run: its effects are the
	// kernel's results, visible to whoever waited on an event recorded
	// after it.
	Launch(run func()) error
	// Close stops the stream: work it did not reach is dropped and the
	// events behind it fail with an error marked cuda.ErrDeviceLost. It
	// returns once the stream stopped; a second Close returns too.
	Close()
}

// T is what the checks need of a test: *testing.T, or a recorder in this
// package's own tests, which run the checks against broken streams to see
// them fail.
type T interface {
	require.TestingT
	Helper()
	Cleanup(func())
}

// Factory builds the streams under test.
type Factory struct {
	// New returns a fresh, idle stream. The suite closes it.
	New func(t T) Stream
}

// checks are the suite, by name, in order.
var checks = []struct {
	name string
	run  func(T, Factory)
}{
	{"EventWaitsForEarlierKernels", eventWaits},
	{"KernelsRunInOrderOneAtATime", inOrder},
	{"RecordFromManyGoroutines", manyRecorders},
	{"WaitHonoursItsContext", waitContext},
	{"CloseFailsWhatItDidNotReach", closeFails},
	{"DeviceTimestamps", timestamps},
}

// Run runs the contract suite.
func Run(t *testing.T, f Factory) {
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { c.run(t, f) })
	}
}

// gate returns a channel that blocks a kernel and the function that
// releases it, safe to call more than once.
func gate() (release chan struct{}, unblock func()) {
	release = make(chan struct{})
	var once sync.Once
	return release, func() { once.Do(func() { close(release) }) }
}

func newStream(t T, f Factory) Stream {
	t.Helper()
	s := f.New(t)
	t.Cleanup(s.Close)
	return s
}

// eventWaits: an event recorded behind a kernel that has not finished is
// not complete (Query says so without blocking, Wait blocks), and completes
// once the kernel ran, with the kernel's results visible.
func eventWaits(t T, f Factory) {
	s := newStream(t, f)
	release, unblock := gate()
	defer unblock() // a failed check must not leave the stream stuck in a kernel
	var result int  // written by the kernel, read after the event
	require.NoError(t, s.Launch(func() { <-release; result = 42 }))
	ev, err := s.Record()
	require.NoError(t, err)
	done, err := ev.Query()
	require.NoError(t, err)
	require.False(t, done, "the event completed while the kernel before it was still running")

	waited := make(chan error, 1)
	go func() { waited <- ev.Wait(context.Background()) }()
	unblock()
	require.NoError(t, <-waited)
	assert.Equal(t, 42, result, "the kernel's result is not visible after its event")
	done, err = ev.Query()
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, ev.Wait(context.Background()), "a completed event waits no more")
}

// inOrder: kernels run in launch order and never overlap, and an event
// recorded after them sees all of them.
func inOrder(t T, f Factory) {
	s := newStream(t, f)
	const n = 200
	var order []int
	var active, overlaps atomic.Int32
	for i := 0; i < n; i++ {
		require.NoError(t, s.Launch(func() {
			if active.Add(1) != 1 {
				overlaps.Add(1)
			}
			order = append(order, i)
			runtime.Gosched() // give an overlapping kernel its chance
			active.Add(-1)
		}))
	}
	ev, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, ev.Wait(context.Background()))
	require.Len(t, order, n)
	for i, v := range order {
		require.Equal(t, i, v, "kernel %d ran in position %d", v, i)
	}
	assert.Zero(t, overlaps.Load(), "kernels of one stream overlapped")
}

// manyRecorders: goroutines launch and record concurrently; every event
// completes after the kernels its goroutine launched before recording it.
func manyRecorders(t T, f Factory) {
	s := newStream(t, f)
	const goroutines, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ran := make([]bool, each)
			for i := 0; i < each; i++ {
				if err := s.Launch(func() { ran[i] = true }); err != nil {
					errs <- err
					return
				}
				ev, err := s.Record()
				if err != nil {
					errs <- err
					return
				}
				if err := ev.Wait(context.Background()); err != nil {
					errs <- err
					return
				}
				if !ran[i] {
					errs <- errors.Newf("goroutine %d: event %d completed before the kernel launched ahead of it", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("%v", err)
	}
}

// waitContext: a wait on an event that cannot complete yet returns when its
// context ends, with an error that wraps the context's, and the event still
// completes later.
func waitContext(t T, f Factory) {
	s := newStream(t, f)
	release, unblock := gate()
	defer unblock()
	require.NoError(t, s.Launch(func() { <-release }))
	ev, err := s.Record()
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	err = ev.Wait(ctx)
	cancel()
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	err = ev.Wait(ctx)
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)

	unblock()
	require.NoError(t, ev.Wait(context.Background()))
}

// closeFails: Close while a kernel runs lets that kernel end, runs nothing
// queued behind it, fails the events behind it with ErrDeviceLost, and
// refuses later launches and records the same way.
func closeFails(t T, f Factory) {
	s := f.New(t)
	started := make(chan struct{})
	release, unblock := gate()
	defer unblock()
	require.NoError(t, s.Launch(func() { close(started); <-release }))
	<-started
	var ranAfter atomic.Bool
	require.NoError(t, s.Launch(func() { ranAfter.Store(true) }))
	ev, err := s.Record()
	require.NoError(t, err)

	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	// The stream refuses new work once Close marked it closed; only then
	// may the running kernel end, so that what is queued behind it is
	// dropped rather than raced against Close.
	for s.Launch(func() { ranAfter.Store(true) }) == nil {
		runtime.Gosched()
	}
	unblock()
	<-closed

	// Close returned: the event has failed already, so Query says so
	// (a Wait would hang on a stream that forgot it).
	done, err := ev.Query()
	assert.False(t, done, "an event the stream never reached completed")
	require.Error(t, err, "an event the stream never reached has not failed when Close returned")
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost), "%v", err)
	err = ev.Wait(context.Background())
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost), "%v", err)
	assert.False(t, ranAfter.Load(), "a kernel queued behind Close ran")

	err = s.Launch(func() {})
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost), "%v", err)
	_, err = s.Record()
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost), "%v", err)
	s.Close() // a second Close returns
}

// timestamps: events are cuda.Timed; no timestamp before completion; after,
// one no earlier than the Record call and no later than the return of the
// wait that saw it, non-decreasing along the stream.
func timestamps(t T, f Factory) {
	s := newStream(t, f)
	release, unblock := gate()
	defer unblock()
	require.NoError(t, s.Launch(func() { <-release }))
	before := time.Now()
	ev, err := s.Record()
	require.NoError(t, err)
	timed, ok := ev.(cuda.Timed)
	require.True(t, ok, "the stream's events carry no device timestamp (cuda.Timed)")
	_, ok = timed.CompletedAt()
	assert.False(t, ok, "a timestamp before the event completed")
	unblock()
	require.NoError(t, ev.Wait(context.Background()))
	after := time.Now()
	at, ok := timed.CompletedAt()
	require.True(t, ok)
	assert.False(t, at.Before(before), "device timestamp %v before the Record call at %v", at, before)
	assert.False(t, at.After(after), "device timestamp %v after the wait returned at %v", at, after)

	prev := at
	for i := 0; i < 20; i++ {
		require.NoError(t, s.Launch(func() {}))
		ev, err := s.Record()
		require.NoError(t, err)
		require.NoError(t, ev.Wait(context.Background()))
		at, ok := ev.(cuda.Timed).CompletedAt()
		require.True(t, ok)
		assert.False(t, at.Before(prev), "event %d at %v, before the previous event at %v", i, at, prev)
		prev = at
	}
}
