package driver

import (
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/kvstream/kvstream/internal/stacks"
	"github.com/stretchr/testify/require"
)

// TestStreamCloseWaitsForACall: a call on a stream that passed its check
// of closed and is inside the driver when Close comes is not overtaken by
// the stream's destruction: Close waits for it, and the calls after Close
// fail with ErrClosed. Close did not wait, and the call reached the driver
// with the destroyed CUstream (CUDA_ERROR_INVALID_HANDLE, or a stream that
// took its address).
func TestStreamCloseWaitsForACall(t *testing.T) {
	g := newFakeGPU()
	a := g.api()
	var armed atomic.Bool
	paused, resume := make(chan struct{}), make(chan struct{})
	orig := a.cuCtxGetCurrent
	a.cuCtxGetCurrent = func(ctx *uintptr) Result {
		if armed.CompareAndSwap(true, false) {
			close(paused)
			<-resume
		}
		return orig(ctx)
	}
	d, err := open(a, 0)
	require.NoError(t, err)
	defer d.Close()
	s, err := d.NewStream()
	require.NoError(t, err)

	recorded := make(chan error, 1)
	armed.Store(true)
	go func() {
		_, err := s.RecordEvent() // passes the check, then pauses in the driver
		recorded <- err
	}()
	<-paused
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	for !stacks.Blocked("driver.(*Stream).Close", func(g stacks.Goroutine) bool { return g.State == "sync.RWMutex.Lock" }) {
		select {
		case err := <-closed:
			close(resume) // let the call end, so that the device closes
			t.Fatalf("Close returned (%v) while a call on the stream was in the driver", err)
		default:
			runtime.Gosched()
		}
	}
	close(resume)
	require.NoError(t, <-recorded, "the call ran on the live stream")
	require.NoError(t, <-closed)
	_, err = s.RecordEvent()
	require.ErrorIs(t, err, ErrClosed)
}
