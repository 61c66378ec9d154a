// Package scalebench is `kvstream bench scale`: the engine's cost curve
// along four axes of its work, rooms in flight, destinations per chunk,
// hook layers and the fragmentation of the decode pages, one axis at a
// time around a base point.
//
// The engine's own figures (LayerEnd, the boundary fan-out, allocations,
// heap per room, host time per write) are taken on a real engine
// (system.New) whose stream records events that are complete at once and
// whose transport (null) accepts every batch and completes it on its own
// goroutine without moving a byte: what they measure is the engine's work,
// without the device's or the fabric's, and the buffers need no memory, so
// a 100k-page chunk costs only its page lists. The plan's time is
// plan.BuildPlan's on a 100k-page chunk. Exposed ÷ floor is taken from
// `kvstream sim` (lab/workload: virtual GPU, loopback with a modeled link)
// with the point's rooms in one forward, destinations (decode TP) or
// layers: the forward's last exposed time over its floor's last landing.
package scalebench
