package core

import "slices"

// croom is one room's state.
type croom struct {
	id        uint64
	born      uint64 // the core's count of rooms when it was created: rooms of one id in order
	expected  bool
	pages     []int       // Expected pages; nil when learned from notices
	learned   map[int]int // position -> page, for a room nobody Expected
	held      []int       // pages it holds in the ledger
	from      string      // the identity Expect named, or ""
	ident     string      // the identity that reports it, once one did
	group     *GroupRoom  // from its first report (the page size is the session's)
	reporters map[*csession]bool
	// pageless are, per session, its successful chunks of no page in
	// this room (nobody Expected it): csession.pageless, given back when
	// the room is forgotten.
	pageless map[*csession]int
	chunks   []Chunk
	complete bool
	err      error // its published failure
	// pendingErr is a failure decided while some lost sessions' access is
	// still being revoked (awaiting): published once they answered, marked
	// ErrNotQuiesced unless every revocation was confirmed.
	pendingErr error
	awaiting   map[*csession]bool
	// dirty are the sessions that may still write its pages; poisoned: one
	// of them could not be confirmed revoked.
	dirty    map[*csession]bool
	poisoned bool
	released bool
	// cancelling: the server cancelled it (Server.Cancel), and says so
	// (CancelSettled) once its pages are quiet and freed.
	cancelling bool
	timer      uint64
}

// ended reports whether the room's outcome is decided (published or
// waiting for revocations).
func (r *croom) ended() bool { return r.complete || r.err != nil || r.pendingErr != nil }

// quiet reports whether no peer may still write the room's pages.
func (r *croom) quiet() bool {
	return (r.complete || r.err != nil) && len(r.dirty) == 0 && !r.poisoned
}

// snapshot is the room as the serving stack sees it (Wait, RoomEnded):
// a copy.
func (r *croom) snapshot() Room {
	out := Room{ID: r.id, Pages: slices.Clone(r.pages), Complete: r.complete, Chunks: make([]Chunk, len(r.chunks))}
	for i, ch := range r.chunks {
		out.Chunks[i] = cloneChunk(ch)
	}
	return out
}

func cloneChunk(ch Chunk) Chunk {
	ch.Positions, ch.DstPages = slices.Clone(ch.Positions), slices.Clone(ch.DstPages)
	return ch
}
