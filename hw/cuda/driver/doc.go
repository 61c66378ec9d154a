// Package driver implements the hw/cuda interfaces (Stream, Event) over the
// real CUDA driver API. libcuda.so.1 is loaded at run time with
// github.com/ebitengine/purego, so the package builds and links with
// CGO_ENABLED=0, and a binary that never calls Open runs on machines without
// a GPU or an NVIDIA driver.
//
// kvstream needs very little from the GPU: an event recorded on the serving
// stack's compute stream after a group of layers was enqueued, which
// submitters wait on (off the forward thread) before they post that group's
// RDMA writes (docs/ARCHITECTURE.md, invariant 1). The package also offers plain device
// memory (alloc, copies, memset) and asynchronous copies on a stream, so that
// tests and benchmarks can place KV pools on the GPU and enqueue work that
// takes a realistic time.
//
// # Using it from the engine
//
//	dev, err := driver.Open(0) // errors.Is(err, driver.ErrNoDriver/ErrNoDevice): fall back to hw/cuda/sim
//	defer dev.Close()
//	compute := dev.WrapStream(stackStream) // the serving stack's CUstream; never destroyed here
//	var s cuda.Stream = compute             // what the forward actor records on
//
// # Contexts and threads
//
// The package uses the device's primary context (cuDevicePrimaryCtxRetain),
// the same context the CUDA runtime API uses, so streams and memory of a
// serving stack built on the runtime API are valid here. A CUDA context is
// bound per OS thread while Go moves goroutines between threads, so every
// driver call that needs the context runs with the goroutine locked to its
// thread, after making the primary context current there; the thread's
// previous context is restored afterwards, so that a serving stack that
// keeps its own context current on its forward thread keeps it. Callers do
// not need to lock threads or manage contexts.
//
// # Errors
//
// Driver failures are *Error values (operation, CUresult and its name).
// Those after which the context is unusable (illegal address, launch
// failure, ECC error, ...; see Result.DeviceLost) are also marked with
// cuda.ErrDeviceLost, which the engine escalates; the others fail one
// operation and are left unmarked. Open marks its failures with ErrNoDriver
// or ErrNoDevice so that callers can fall back to the simulator.
package driver
