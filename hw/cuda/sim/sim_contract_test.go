package sim

import (
	"testing"

	"github.com/kvstream/kvstream/hw/cuda/cudatest"
)

// contract adapts a virtual GPU's stream to the shared suite: a kernel of
// no modeled duration whose results are the function's.
type contract struct {
	*Stream
	gpu *GPU
}

func (c contract) Launch(run func()) error { return c.Stream.Launch(Kernel{Name: "k", Run: run}) }

func (c contract) Close() { c.gpu.Close() }

// The virtual GPU passes the same stream/event contract as the CPU stream
// (hw/cuda/cpu).
func TestStreamContract(t *testing.T) {
	cudatest.Run(t, cudatest.Factory{New: func(cudatest.T) cudatest.Stream {
		g := New(Options{})
		return contract{Stream: g.NewStream("contract"), gpu: g}
	}})
}
