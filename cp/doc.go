// Package cp holds the pure arithmetic of a KV transfer: which pages a
// context-parallel (CP) rank owns, where they go on the decode side, how they
// coalesce into runs, and which byte blocks a run becomes for one buffer.
//
// Everything here is a plain function over page lists: no goroutines, no
// clocks, no hardware. The per-layer path and the monolithic send both derive
// their writes from these functions, which is what makes their bytes identical
// (invariant 2 of docs/ARCHITECTURE.md). Invalid input is an error that names the bad value;
// nothing here panics on caller data.
package cp
