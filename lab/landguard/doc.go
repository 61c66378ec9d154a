// Package landguard is the transport oracle of the lab's runs (`kvstream
// sim`, `kvstream generate`): wrapped around each prefill rank's transport
// below the engine, it fails a chunk's SUCCESS before every batch of it
// landed, a batch posted after it, a write to a page no chunk registered,
// and, summed over the prefill ranks, a chunk that landed more or fewer
// bytes on a decode rank than the pages it registered there hold (a sender
// that writes the right bytes twice leaves the pools equal). It complements
// the byte check, which sees only the pools' final contents.
package landguard
