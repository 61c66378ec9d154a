// Package cpu is a compute stream on the CPU: kernels are Go functions run
// in launch order on the stream's own goroutine, and events complete when
// the stream reaches them, stamped with that instant. It honours the
// contract of hw/cuda (the suite in hw/cuda/cudatest, which the virtual GPU
// passes too), so the engine runs unchanged on real compute with real
// timing: a kernel takes what its Go code takes, and an event's device
// timestamp is when the work before it really ended.
//
// Where hw/cuda/sim models a kernel's duration and shows its results only at
// the end of the modeled interval, a CPU kernel's stores happen while it
// runs, like a real GPU's: a transfer that read a layer before its event
// completed could see a half-written page, which is what byte and token
// comparisons downstream catch.
//
// A kernel that panics is a device fault: the stream is lost (as a CUDA
// context after an illegal address), every event not yet reached fails,
// and later launches and records return the error, marked
// cuda.ErrDeviceLost, with the panic's value.
package cpu
