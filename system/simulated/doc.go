// Package simulated is the hardware of simulations, tests and examples for
// a prefill engine: a virtual GPU's compute stream (hw/cuda/sim) and a node
// of the process's in-memory loopback fabric (hw/rdma/loopback). It lives
// apart from package system so that a production binary, which passes a
// real GPU and transport, does not link either:
//
//	eng, err := system.New(cfg, system.WithHardware(simulated.Hardware()))
package simulated
