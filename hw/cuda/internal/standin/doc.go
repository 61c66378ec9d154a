// Package standin is what the CUDA stand-ins (hw/cuda/cpu, a stream on the
// CPU, and hw/cuda/sim, the virtual GPU) share: a stream's queue, from
// which its goroutine takes the work launched so far, and host events that
// complete at an instant the stream stamps or fail with the stream. What a
// stream does with its work (run a Go function now, or at a modeled
// instant) stays each stand-in's own.
package standin
