// Package tally counts the completions of posted batches for a loop that
// keeps a window of batches in flight: a batch's done callback is
// (*Tally).Done, and the loop reads the count and waits for it.
//
// It replaces the obvious buffered channel of completions, whose send (on
// the transport's goroutine) and receive (on the posting one) both lock the
// channel: at 64 KiB batches on two cores that lock's cache line, passed
// from core to core twice per batch, cost as much as a tenth of the copy.
// A Done is one atomic add, and a channel operation only when the poster
// said it waits.
package tally
