package system

import (
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
)

// withSimulated is WithHardware of package simulated's hardware, which
// these tests cannot import (it imports this package).
func withSimulated() Option { return WithHardware(simHardware{}) }

type simHardware struct{}

func (simHardware) Stream() (cuda.Stream, func(), error) {
	g := sim.New(sim.Options{})
	return g.NewStream("compute"), g.Close, nil
}

func (simHardware) Transport() (rdma.Transport, error) {
	return loopback.Default().NewTransport("prefill-test")
}
