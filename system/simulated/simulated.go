package simulated

import (
	"fmt"
	"sync/atomic"

	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
)

// Hardware makes, for one engine, a virtual GPU's compute stream (the
// engine's Stream) and a node of loopback.Default(); the engine closes
// both when it closes. Simulated hardware moves bytes between buffers of
// this process only.
func Hardware() system.Hardware { return hardware{} }

type hardware struct{}

func (hardware) Stream() (cuda.Stream, func(), error) {
	g := sim.New(sim.Options{})
	return g.NewStream("compute"), g.Close, nil
}

// engines names the loopback nodes apart.
var engines atomic.Uint64

func (hardware) Transport() (rdma.Transport, error) {
	return loopback.Default().NewTransport(fmt.Sprintf("prefill-%d", engines.Add(1)))
}
