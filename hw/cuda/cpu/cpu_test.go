package cpu

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/cudatest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// contract adapts a CPU stream to the suite.
type contract struct{ *Stream }

func (c contract) Launch(run func()) error { return c.Stream.Launch(Kernel{Name: "k", Run: run}) }

func TestStreamContract(t *testing.T) {
	cudatest.Run(t, cudatest.Factory{New: func(cudatest.T) cudatest.Stream {
		return contract{NewStream("contract", Options{})}
	}})
}

// Real timing: an event behind a kernel is stamped no earlier than the
// instant the kernel's work really ended (a virtual GPU stamps the modeled
// end instead), and spans report each kernel's real interval, in order.
func TestTimestampsAreRealKernelEnds(t *testing.T) {
	var mu sync.Mutex
	var spans []Span
	s := NewStream("compute", Options{OnSpan: func(sp Span) { mu.Lock(); spans = append(spans, sp); mu.Unlock() }})
	defer s.Close()
	release := make(chan struct{})
	var ended time.Time // written by the kernel, read after its event
	require.NoError(t, s.Launch(Kernel{Name: "L0", Run: func() { <-release; ended = time.Now() }}))
	ev, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, s.Launch(Kernel{Name: "L1", Run: func() {}}))
	close(release)
	require.NoError(t, s.Synchronize(context.Background()))
	at, ok := ev.(cuda.Timed).CompletedAt()
	require.True(t, ok)
	assert.False(t, at.Before(ended), "event stamped %v, before its kernel ended at %v", at, ended)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, spans, 2)
	assert.Equal(t, "L0", spans[0].Name)
	assert.Equal(t, "compute", spans[0].Stream)
	assert.False(t, spans[0].End.Before(ended), "span ends %v, before the kernel's work ended at %v", spans[0].End, ended)
	assert.False(t, at.Before(spans[0].End), "event stamped before the span of the kernel ahead of it ended")
	assert.False(t, spans[1].Start.Before(spans[0].End), "L1 started before L0 ended")
}

// A kernel that panics loses the stream like a device fault: the events
// behind it fail, later work is refused, all marked ErrDeviceLost, with the
// panic's value in the error; nothing queued behind it runs.
func TestPanicLosesTheStream(t *testing.T) {
	s := NewStream("compute", Options{})
	defer s.Close()
	before, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, s.Launch(Kernel{Name: "bad", Run: func() { panic("index out of range [7]") }}))
	ran := false
	require.NoError(t, s.Launch(Kernel{Name: "after", Run: func() { ran = true }}))
	ev, err := s.Record()
	require.NoError(t, err)

	require.NoError(t, before.Wait(context.Background()), "an event ahead of the fault completes")
	err = ev.Wait(context.Background())
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost), "%v", err)
	assert.Contains(t, err.Error(), `kernel "bad" panicked: index out of range [7]`)
	assert.False(t, ran)
	err = s.Launch(Kernel{Name: "later", Run: func() {}})
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrDeviceLost))
	require.Error(t, s.Synchronize(context.Background()))
	require.Error(t, s.Err())
}

func TestLaunchRefusesAKernelWithoutWork(t *testing.T) {
	s := NewStream("compute", Options{})
	defer s.Close()
	err := s.Launch(Kernel{Name: "empty"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `kernel "empty" has no Run`)
	require.NoError(t, s.Synchronize(context.Background()), "a refused launch leaves the stream usable")
	assert.Equal(t, "compute", s.Name())
}
