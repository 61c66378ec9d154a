// Package sim is a virtual GPU: streams that execute enqueued kernels in
// order, each taking a modeled duration, and events that complete when their
// stream passes them. It is the embedded default and the test double for
// hw/cuda/driver.
//
// Kernels really run Go code (the simulated attention kernel of layer l
// writes that layer's KV bytes). A kernel's results become visible at the
// END of its modeled interval (Kernel.Run), and Kernel.Start runs at its
// start (the model marks its output pages as poisoned there), so a transfer
// that reads a layer before its event completed, even while the writing
// kernel runs, sees stale or poisoned bytes and is caught by byte
// comparison, as on a real GPU where a kernel's stores land at no defined
// instant before it ends. Kernel.Prepare computes the results late in the
// interval: the emulator's own work stays away from a kernel's start, which
// is the previous forward's end, where the last transfers of that forward
// are landing and must not wait for the emulator's CPU.
//
// Events carry a device timestamp (cuda.Timed): the modeled instant the
// stream passed them.
//
// Modeled time may run faster than wall time (Options.TimeScale). The stream
// keeps a modeled timeline: a kernel starts when the previous one ended (or
// when it was launched, if the stream was idle), so sleeping imprecision does
// not accumulate.
package sim
