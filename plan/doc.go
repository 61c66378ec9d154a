// Package plan holds kvstream's vocabulary and the per-chunk transfer plan:
// the prefill pool's buffers and their layout into hook-layer groups, the
// decode peers and a room's destinations, the chunk a scheduler registers,
// and BuildPlan, which validates a chunk against all of them and computes,
// once, every run it sends. It is pure (no clocks or hardware; a chunk of
// many destinations is planned on a few goroutines that end before
// BuildPlan returns, with the result it would have alone) and sits below
// the actors, which execute plans, and the system façade, which names
// these types for its users.
package plan
