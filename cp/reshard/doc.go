// Package reshard computes what one prefill rank sends to each decode rank
// when the two sides shard a model's KV cache differently: other tensor
// parallel (TP) degrees, other pipeline parallel (PP) stages, other page
// layouts. It answers, once per pairing, which layers, which KV heads and
// which byte ranges within a page go from this prefill rank to every decode
// rank, with each destination byte sent by exactly one prefill rank; and, per
// layer group at run time, turns a chunk's page runs (cp.Run) into contiguous
// writes (cp.Block) without allocating.
//
// It is pure, like package cp: no goroutines, clocks or hardware, and caller
// mistakes are ErrBadInput errors that name the value. The rules are in the
// "Resharding" section of docs/ARCHITECTURE.md.
package reshard
