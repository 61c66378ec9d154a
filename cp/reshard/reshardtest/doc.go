// Package reshardtest is the independent reference for resharding: a
// whole-tensor reshard written from the sides' parameters alone, with nothing
// from package reshard. Every prefill rank (PP stage x TP rank x CP rank)
// holds its share of a request's KV in its own page buffers; the reference
// gathers it into one logical [layer][kind][token][head][byte] tensor and
// re-splits that, element by element, into every decode rank's expected
// buffers. cp/reshard's oracle and the engine-level oracle in tests/ compare
// what a plan or a real engine wrote with it.
//
// It is pure test support: no goroutines, no hardware, no randomness.
package reshardtest
