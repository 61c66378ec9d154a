// Package cuda defines what kvstream needs from a GPU: a compute stream on
// which it records events, and events it can query and wait on. Write-before-
// read (invariant 1 of docs/ARCHITECTURE.md) rests on these two: an event recorded after a
// group's last layer was enqueued completes only when that layer's KV is in
// memory.
//
// Implementations: hw/cuda/sim (a virtual GPU, the default and the test
// double) and hw/cuda/driver (libcuda through purego).
package cuda
