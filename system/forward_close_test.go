package system

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// heldHardware gives the engine a stream it owns (as WithGPU's) whose
// first Record waits until the test lets it go, and which tells whether a
// Record ran on it once it was released.
type heldHardware struct {
	gpu      *sim.GPU
	entered  chan struct{} // closed when the first Record began
	letGo    chan struct{}
	first    atomic.Bool
	released atomic.Bool
	late     atomic.Bool // a Record ended on the stream after its release
}

func (h *heldHardware) Stream() (cuda.Stream, func(), error) {
	return heldStream{h: h, s: h.gpu.NewStream("compute")}, func() { h.released.Store(true); h.gpu.Close() }, nil
}

func (h *heldHardware) Transport() (rdma.Transport, error) { panic("the test passes WithTransport") }

type heldStream struct {
	h *heldHardware
	s *sim.Stream
}

func (s heldStream) Record() (cuda.Event, error) {
	if !s.h.first.Swap(true) {
		close(s.h.entered)
		<-s.h.letGo
	}
	ev, err := s.s.Record()
	if s.h.released.Load() {
		s.h.late.Store(true)
	}
	return ev, err
}

// TestCloseWaitsForALayerEndRecording: Close releases the stream the
// engine owns (WithGPU's is destroyed: cuEventRecord on it is a use after
// free) only once a LayerEnd recording on it returned, and a LayerEnd or
// End after Close returns ErrClosed without touching the stream. (Close
// does not refuse them before: a Finish it waits for may wait for an End,
// TestGaugesDoNotWaitForClose.)
func TestCloseWaitsForALayerEndRecording(t *testing.T) {
	p := newEnginePools(t)
	hw := &heldHardware{gpu: sim.New(sim.Options{}), entered: make(chan struct{}), letGo: make(chan struct{})}
	e, err := New(Config{Buffers: p.buffers, HookLayers: 3, PageSize: 4, GroupSize: 1},
		WithTransport(p.pre), WithHardware(hw), WithLogger(zap.NewNop()), WithGetenv(func(string) string { return "" }))
	require.NoError(t, err)
	require.NoError(t, e.AddPeer(p.peer))
	_, err = e.Register(t.Context(), goodSpec())
	require.NoError(t, err)
	fw, err := e.BeginForward()
	require.NoError(t, err)

	ended := make(chan error, 1)
	go func() { ended <- fw.LayerEnd(0) }() // a boundary (K = 1): it records
	<-hw.entered
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	// Close either returns (it did not wait for the LayerEnd) or waits
	// for it: a condition either way, not a time.
	var returned bool
	require.Eventually(t, func() bool {
		select {
		case err := <-closed:
			require.NoError(t, err)
			returned = true
			return true
		default:
			return e.records.n.Load() == gateClosed|1
		}
	}, time.Minute, 100*time.Microsecond)
	assert.False(t, returned, "Close returned while a LayerEnd was recording on the stream it released")
	close(hw.letGo)
	require.NoError(t, <-ended)
	if !returned {
		require.NoError(t, <-closed)
	}
	assert.False(t, hw.late.Load(), "a Record ran on the stream after Close released it")

	assert.ErrorIs(t, fw.LayerEnd(1), ErrClosed)
	assert.ErrorIs(t, fw.End(), ErrClosed)
}
