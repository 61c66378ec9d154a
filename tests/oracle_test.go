package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lyingStream records events that are complete at once, as if the engine
// skipped the event wait: the oracle must catch the stale bytes it sends.
type lyingStream struct{ cuda.Stream }

func (lyingStream) Record() (cuda.Event, error) { return doneEvent{}, nil }

type doneEvent struct{}

func (doneEvent) Query() (bool, error)       { return true, nil }
func (doneEvent) Wait(context.Context) error { return nil }

// failRecorder is a require.TestingT that remembers a failure instead of
// ending the test.
type failRecorder struct{ msgs []string }

func (f *failRecorder) Errorf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}
func (f *failRecorder) FailNow() { panic(f) }

func (f *failRecorder) run(fn func()) {
	defer func() {
		if r := recover(); r != nil && r != f {
			panic(r)
		}
	}()
	fn()
}

// TestOracleCatchesReadBeforeWrite shows the byte oracle is not vacuous: the
// same scenario passes with real events and fails when events complete
// before the kernels that write the layers.
func TestOracleCatchesReadBeforeWrite(t *testing.T) {
	s := &scenario{mla: true, layers: 6, hooks: 5, itemLen: 32, pageSize: 4, group: 2, cp: cp.CP{Size: 1},
		layerTime: 2 * time.Millisecond, pages: 16,
		rooms: []roomSpec{{room: 1, tokens: 40, chunkEnds: []int{40}, src: seq(10), infos: []infoSpec{{peer: 0, dst: seqFrom(3, 10)}}}}}

	honest := run(t, s, runOpts{perLayer: true})
	defer honest.free()
	checkOracle(t, s, honest)

	for _, perLayer := range []bool{true, false} {
		lied := &failRecorder{}
		out := run(t, s, runOpts{perLayer: perLayer, wrapStream: func(st cuda.Stream) cuda.Stream {
			// A kernel an hour long heads the stream, so that no layer is
			// written before the run ends (closing the GPU cuts it short):
			// every transfer the lie lets go reads garbage, however late a
			// starved sender reads. With the layers' own 2 ms, a sender
			// that stalled past them read written bytes and the lie went
			// uncaught.
			require.NoError(t, st.(*sim.Stream).Launch(sim.Kernel{Name: "hold the layers", Duration: time.Hour}))
			return lyingStream{st}
		}})
		lied.run(func() { checkOracle(lied, s, out) })
		out.free()
		require.NotEmpty(t, lied.msgs, "per-layer=%v: a transfer that reads before the write must be caught", perLayer)
		assert.Contains(t, lied.msgs[0], "decode bytes differ")
	}
}
