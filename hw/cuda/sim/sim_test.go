package sim

import (
	"context"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEventCompletesAfterPrecedingKernels(t *testing.T) {
	g := New(Options{})
	defer g.Close()
	s := g.NewStream("compute")
	release := make(chan struct{})
	var order []string
	var mu sync.Mutex
	note := func(x string) { mu.Lock(); order = append(order, x); mu.Unlock() }

	require.NoError(t, s.Launch(Kernel{Name: "layer0", Run: func() { <-release; note("layer0") }}))
	ev, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, s.Launch(Kernel{Name: "layer1", Run: func() { note("layer1") }}))

	done, err := ev.Query()
	require.NoError(t, err)
	assert.False(t, done, "event must not complete while layer0 runs")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err = ev.Wait(ctx)
	cancel()
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded))

	close(release)
	require.NoError(t, ev.Wait(context.Background()))
	done, err = ev.Query()
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, s.Synchronize(context.Background()))
	assert.Equal(t, []string{"layer0", "layer1"}, order)
}

func TestModeledDurationsAndTimeScale(t *testing.T) {
	var spans []Span
	var mu sync.Mutex
	g := New(Options{TimeScale: 10, OnSpan: func(s Span) { mu.Lock(); spans = append(spans, s); mu.Unlock() }})
	defer g.Close()
	s := g.NewStream("compute")
	start := time.Now()
	// Each launch's bounds: a kernel launched after the one before it
	// ended (modeled) starts at its launch, not back to back, which a
	// starved test can cause; the oracle allows for it rather than
	// assume launches are quick.
	var launchFrom, launchTo [5]time.Time
	for i := range 5 {
		launchFrom[i] = time.Now()
		require.NoError(t, s.Launch(Kernel{Name: "k", Duration: 20 * time.Millisecond}))
		launchTo[i] = time.Now()
	}
	require.NoError(t, s.Synchronize(context.Background()))
	// 100 ms modeled at 10x is 10 ms of wall time at least; how much more
	// is the machine's business, not the oracle's (the spans below say
	// whether the scale was applied).
	assert.GreaterOrEqual(t, time.Since(start), 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, spans, 5)
	for i, sp := range spans {
		assert.Equal(t, 2*time.Millisecond, sp.End.Sub(sp.Start), "kernel %d: 20 ms modeled at 10x", i)
		assert.False(t, sp.Ran.Before(sp.End), "kernel %d: reported before its modeled end", i)
		if i > 0 && !launchTo[i].After(spans[i-1].End) {
			assert.Equal(t, spans[i-1].End, sp.Start, "kernel %d: launched before the one ahead ended, so back to back", i)
		} else {
			assert.False(t, sp.Start.Before(launchFrom[i]) || sp.Start.After(launchTo[i]),
				"kernel %d: stream idle at its launch, so it starts then (%v, launched in [%v, %v])", i, sp.Start, launchFrom[i], launchTo[i])
		}
	}
}

func TestCloseFailsPendingEvents(t *testing.T) {
	g := New(Options{})
	s := g.NewStream("compute")
	started, block := make(chan struct{}), make(chan struct{})
	require.NoError(t, s.Launch(Kernel{Start: func() { close(started); <-block }}))
	// Recorded while the kernel runs, so the stream has not taken it yet.
	<-started
	ev, err := s.Record()
	require.NoError(t, err)
	go func() {
		// Let the kernel end only once Close marked the stream closed.
		for s.q.Err() == nil {
			runtime.Gosched()
		}
		close(block)
	}()
	g.Close()
	err = ev.Wait(context.Background())
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost))
	require.Error(t, s.Launch(Kernel{}))
}

func TestInjectedFaults(t *testing.T) {
	faults := map[uint64]Fault{1: NeverComplete, 2: WaitError, 3: RecordError}
	g := New(Options{Faults: func(e EventInfo) Fault { return faults[e.Seq] }})
	defer g.Close()
	s := g.NewStream("compute")

	never, err := s.Record() // seq 1
	require.NoError(t, err)
	bad, err := s.Record() // seq 2
	require.NoError(t, err)
	_, err = s.Record() // seq 3
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrInjected))

	err = bad.Wait(context.Background())
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrInjected))
	require.NoError(t, s.Synchronize(context.Background()), "later events still complete")
	done, err := never.Query()
	require.NoError(t, err)
	assert.False(t, done)
}

// A kernel's results (Run) appear at the end of its modeled interval, after
// Start; the event after it carries the modeled end as its timestamp (or
// its record instant, if it was recorded after that end).
func TestResultsAtTheEndAndEventTimestamp(t *testing.T) {
	var spans []Span
	var mu sync.Mutex
	g := New(Options{OnSpan: func(s Span) { mu.Lock(); spans = append(spans, s); mu.Unlock() }})
	defer g.Close()
	s := g.NewStream("compute")
	started, release := make(chan struct{}), make(chan struct{})
	var order []string
	note := func(x string) { mu.Lock(); order = append(order, x); mu.Unlock() }
	require.NoError(t, s.Launch(Kernel{Name: "k", Duration: 20 * time.Millisecond,
		Start: func() { note("start"); close(started); <-release },
		Run:   func() { note("run") }}))
	// The event's instant is the later of the kernel's end and the
	// Record call; a starved test can reach Record after the modeled
	// end, so the record call's bounds are part of the oracle.
	beforeRecord := time.Now()
	ev, err := s.Record()
	afterRecord := time.Now()
	require.NoError(t, err)
	<-started
	mu.Lock()
	assert.Equal(t, []string{"start"}, order, "results must not appear while the kernel runs")
	mu.Unlock()
	_, ok := ev.(cuda.Timed).CompletedAt()
	assert.False(t, ok, "no timestamp before the event completed")
	close(release)
	require.NoError(t, ev.Wait(context.Background()))
	at, ok := ev.(cuda.Timed).CompletedAt()
	require.True(t, ok)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"start", "run"}, order)
	require.Len(t, spans, 1)
	if end := spans[0].End; end.After(afterRecord) {
		assert.True(t, at.Equal(end), "event at %v, kernel ended %v", at, end)
	} else {
		// Recorded after the kernel's modeled end: stamped when recorded.
		assert.False(t, at.Before(end), "event at %v, before the kernel's end %v", at, end)
		assert.False(t, at.Before(beforeRecord) || at.After(afterRecord),
			"event at %v, recorded in [%v, %v]", at, beforeRecord, afterRecord)
	}
}

// An event recorded on an idle stream completed when it was recorded, not at
// the end of the last kernel long ago.
func TestEventOnIdleStreamTimestamp(t *testing.T) {
	g := New(Options{})
	defer g.Close()
	s := g.NewStream("compute")
	require.NoError(t, s.Synchronize(context.Background()))
	before := time.Now()
	ev, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, ev.Wait(context.Background()))
	at, ok := ev.(cuda.Timed).CompletedAt()
	require.True(t, ok)
	assert.False(t, at.Before(before))
}

// TestCloseInterruptsAModeledSleep: a kernel modeled as an hour long (a
// tiny --time-scale does that) must not hold Close: the stream's sleep ends
// at Close, and the events behind the kernel fail instead of completing.
func TestCloseInterruptsAModeledSleep(t *testing.T) {
	g := New(Options{})
	s := g.NewStream("s")
	require.NoError(t, s.Launch(Kernel{Name: "long", Duration: time.Hour, Run: func() { t.Error("an interrupted kernel must not run") }}))
	ev, err := s.Record()
	require.NoError(t, err)
	closed := make(chan struct{})
	go func() { g.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute): // only an uninterrupted hour-long sleep gets here
		t.Fatal("Close waited for the modeled sleep")
	}
	err = ev.Wait(context.Background())
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost), "%v", err)
}

// A kernel's three steps run in order, Prepare's work is what Run
// publishes, and an event recorded after the kernel sees Run's results.
func TestKernelStepsRunInOrder(t *testing.T) {
	g := New(Options{})
	defer g.Close()
	s := g.NewStream("compute")
	var steps []string
	var staged, published int
	require.NoError(t, s.Launch(Kernel{Name: "k", Duration: 4 * time.Millisecond,
		Start:   func() { steps = append(steps, "start") },
		Prepare: func() { steps = append(steps, "prepare"); staged = 42 },
		Run:     func() { steps = append(steps, "run"); published = staged },
	}))
	require.NoError(t, s.Synchronize(context.Background()))
	assert.Equal(t, []string{"start", "prepare", "run"}, steps)
	assert.Equal(t, 42, published)
}

// TestKernelBeyondTheRangeIsHeld: a kernel whose wall time is beyond
// time.Duration's range (a long modeled one at a slow time scale) is held
// at the longest time, so it is still running when its event is waited
// on; the conversion once wrapped its end into the past, and it completed
// at once.
func TestKernelBeyondTheRangeIsHeld(t *testing.T) {
	opts := Options{TimeScale: 1e-3}
	long := time.Duration(math.MaxInt64 / 2)
	w, ok := opts.WallTime(long)
	require.False(t, ok, "%v over a time scale of 1e-3 does not fit", long)
	require.Equal(t, MaxModeled, w)
	w, ok = opts.WallTime(time.Millisecond)
	require.True(t, ok)
	require.Equal(t, time.Second, w)

	g := New(opts)
	defer g.Close()
	s := g.NewStream("s")
	require.NoError(t, s.Launch(Kernel{Name: "long", Duration: long}))
	ev, err := s.Record()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, ev.Wait(ctx), context.DeadlineExceeded, "the kernel of 146 years at 1e-3 still runs")
}
