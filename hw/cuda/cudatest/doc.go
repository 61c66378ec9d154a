// Package cudatest is the compute-stream contract as a test suite: one set
// of checks that every cuda.Stream implementation whose kernels kvstream can
// launch must pass (hw/cuda/sim, the virtual GPU; hw/cuda/cpu, real compute
// on the CPU). It checks what the engine relies on: an event completes only
// after every kernel enqueued before it ran, never before; kernels run in
// launch order, one at a time; Record works from any goroutine; a wait
// honours its context; closing the stream fails what it did not reach; and
// an event carries a device timestamp within the instants that bound it.
//
// What is particular to one implementation (modeled durations, fault
// injection, real kernel timing) stays in that implementation's own tests.
package cudatest
