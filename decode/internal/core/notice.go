package core

import (
	"fmt"
	"slices"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/messages/wire"
)

// A chunk notice, checked against its session (token, node, certificate),
// the pool and its room before it changes anything; a successful chunk
// then goes to Verify (verify.go) or straight to its room's decision.

// statuses are the chunk statuses a notice may carry.
var statuses = map[wire.Status]messages.Status{
	wire.Status_SUCCEEDED: messages.Succeeded, wire.Status_FAILED: messages.Failed, wire.Status_DROPPED: messages.Dropped,
}

// refuseNotice answers a notice that changes no room, and counts it
// against its session.
func (c *Core) refuseNotice(s *csession, n *wire.ChunkNotice, code wire.Code, reason string, err error) {
	c.warn("chunk notice refused", "prefill", s.Prefill, "room", n.Room, "start", n.Start, "end", n.End, "reason", reason, "error", err.Error())
	c.emit(AnswerNotice{Code: code, Reason: reason, Text: err.Error()})
	s.report.Failed++
	if s.err == nil {
		s.err = errors.Mark(err, ErrChunkFailed)
	}
}

// notice checks a notice and admits its chunk into its room (created
// when nobody Expected it and AcceptUnknownRooms says so), or refuses it.
func (c *Core) notice(m NoticeMsg) {
	n := m.Notice
	if n == nil {
		c.emit(AnswerNotice{Code: wire.Code_BAD_INPUT, Reason: "bad_input", Text: "notice: empty"})
		return
	}
	s, why := c.sessions.sessionFor(m.From, n.Session, c.r.TLS)
	if s == nil {
		c.warn("chunk notice refused", "node", m.From.Node, "room", n.Room, "reason", "not_session", "error", why)
		c.emit(AnswerNotice{Code: wire.Code_REFUSED, Reason: "not_session", Text: fmt.Sprintf("room %d notice: %s", n.Room, why)})
		return
	}
	s.notices++
	c.heard(s)
	ch, err := c.checkNotice(s, n)
	r := c.rooms[n.Room]
	if r == nil {
		if c.lateNotice(s, n, ch, err) {
			return
		}
		if slices.Contains(s.ended, n.Room) {
			c.refuseNotice(s, n, wire.Code_BAD_INPUT, "room_ended", errors.Newf("room %d chunk [%d, %d): the room already ended", n.Room, n.Start, n.End))
			return
		}
		if err != nil {
			c.refuseNotice(s, n, wire.Code_BAD_INPUT, "bad_input", err)
			return
		}
		if !c.r.AcceptUnknownRooms {
			c.refuseNotice(s, n, wire.Code_BAD_INPUT, "unknown_room", errors.Newf("room %d is unknown to the decode server (not Expected)", n.Room))
			return
		}
	}
	switch {
	case r != nil && r.from != "" && r.from != s.Identity:
		c.refuseNotice(s, n, wire.Code_REFUSED, "not_owner", errors.Newf("room %d is expected from prefill %q, not %q", n.Room, r.from, s.Identity))
		return
	case r != nil && c.r.Group == nil && r.ident != "" && r.ident != s.Identity:
		c.refuseNotice(s, n, wire.Code_REFUSED, "not_owner", errors.Newf("room %d is reported by prefill %q, not %q", n.Room, r.ident, s.Identity))
		return
	case r != nil && c.r.Group == nil && len(r.reporters) > 0 && !r.reporters[s]:
		c.refuseNotice(s, n, wire.Code_REFUSED, "not_owner", errors.Newf("room %d is reported by another session of prefill %q", n.Room, s.Identity))
		return
	case r != nil && r.ended():
		c.refuseNotice(s, n, wire.Code_BAD_INPUT, "room_ended", errors.Newf("room %d chunk [%d, %d): the room already ended (complete: %v)", n.Room, n.Start, n.End, r.complete))
		if err == nil && r.dirty[s] && writesStopped(ch) {
			// Its pages wait for this session (a rank that still owed the
			// room when another failed it): a chunk that ends its writes
			// says it writes them no more, as once the room is released
			// (lateNotice).
			delete(r.dirty, s)
			c.settle(r)
		}
		return
	case (r == nil || !r.reporters[s]) && c.openRooms(s) >= c.r.MaxRoomsPerSession:
		c.refuseNotice(s, n, wire.Code_REFUSED, "room_limit", errors.Newf("room %d: the session already holds %d rooms not ended or not yet quiet (Config.MaxRoomsPerSession)", n.Room, c.r.MaxRoomsPerSession))
		return
	}
	if r == nil {
		r = c.newRoom(n.Room, nil, "")
		if r.ended() && err == nil && writesStopped(ch) {
			// Failed at once (a rank lost), its pages waiting for every
			// session that may write it: this chunk ends the sender's
			// writes.
			delete(r.dirty, s)
		}
	}
	r.reporters[s] = true
	r.ident = s.Identity
	s.rooms[r] = true
	code, reason := wire.Code_BAD_INPUT, "bad_input"
	if err == nil && c.overChunkBound(r, ch) {
		err = errors.Newf("room %d chunk [%d, %d): the room already holds %d chunks (Config.MaxChunksPerRoom)", n.Room, n.Start, n.End, c.r.MaxChunksPerRoom)
		code, reason = wire.Code_REFUSED, "chunk_limit"
	}
	pageless := err == nil && !r.expected && ch.Status == messages.Succeeded && len(ch.Positions) == 0
	if pageless && s.pageless >= c.ledger.pages {
		err = errors.Newf("room %d chunk [%d, %d): a successful chunk of no page, and the session's rooms nobody Expected already hold %d such chunks (as many as the pool has pages)", n.Room, n.Start, n.End, s.pageless)
		code, reason = wire.Code_REFUSED, "chunk_limit"
	}
	if err == nil {
		err = c.claim(r, ch)
	}
	if err != nil {
		// The prefill may have written where it should not (or, past the
		// bound, what the room will never hold): the room must not be
		// decoded, and its pages are quiet only once it is cut off.
		r.dirty[s] = true
		c.failRoom(r, errors.Mark(errors.Mark(errors.Mark(err, ErrBadInput), ErrChunkFailed), ErrNotQuiesced), "bad_input")
		c.refuseNotice(s, n, code, reason, err)
		c.settle(r)
		return
	}
	r.chunks = append(r.chunks, ch)
	if pageless {
		if r.pageless == nil {
			r.pageless = map[*csession]int{}
		}
		r.pageless[s]++
		s.pageless++
	}
	s.report.Chunks++
	if ch.Status == messages.Succeeded && c.r.Verify {
		c.pending = &pending{session: s, room: r, chunk: ch}
		c.emit(CallVerify{Session: s.Token, Chunk: cloneChunk(ch)})
		return
	}
	c.answerDecided(s, r, ch)
}

// openRooms counts the rooms s reported in that have not ended, and those
// nobody Expected that ended but are not forgotten yet (their pages wait
// for the session's revocation): the peer made each of them, so a flood
// of rooms it ends unquiet is bounded too. An Expected room that ended or
// was released lives as long as the serving stack keeps it.
func (c *Core) openRooms(s *csession) int {
	n := 0
	for r := range s.rooms {
		if r.expected && (r.ended() || r.released) {
			continue
		}
		n++
	}
	return n
}

// overChunkBound reports whether ch would be one chunk more than the room
// may hold (Rules.MaxChunksPerRoom): the bound caps the records a peer
// makes the room keep, and is checked before the chunk's pages are
// claimed. A failure is let through: it adds no chunk and ends the room.
func (c *Core) overChunkBound(r *croom, ch Chunk) bool {
	return ch.Status == messages.Succeeded && r.group != nil && len(r.group.chunks) >= c.r.MaxChunksPerRoom && r.group.adds(ch)
}

// lateNotice handles a notice for a room this server released while the
// session still wrote it: the room is over on this side (the prefill is
// told so, without blame), and a final notice (the last chunk, or a
// failure that quiesced) means the session writes it no more.
func (c *Core) lateNotice(s *csession, n *wire.ChunkNotice, ch Chunk, err error) bool {
	late := c.ledger.lingeringOf(n.Room, func(r *croom) bool { return r.reporters[s] || r.dirty[s] })
	for _, r := range late {
		if err == nil && writesStopped(ch) {
			delete(r.dirty, s)
			c.settle(r)
		}
	}
	if len(late) > 0 {
		c.emit(AnswerNotice{Code: wire.Code_ROOM_FAILED, Text: fmt.Sprintf("room %d chunk [%d, %d): the decode server released the room before this chunk", n.Room, n.Start, n.End)})
		c.debug("notice of a released room", "prefill", s.Prefill, "room", n.Room, "start", n.Start, "end", n.End)
	}
	return len(late) > 0
}

// writesStopped reports whether a session's chunk ends its writes of the
// room: its last chunk (chunks finish in send order), or a failure that
// stopped its writes.
func writesStopped(ch Chunk) bool {
	return ch.Last || ch.Status != messages.Succeeded && !ch.NotQuiesced
}

// checkNotice turns a notice into a Chunk, checking what needs no room:
// status, range, page lists against the pool.
func (c *Core) checkNotice(s *csession, m *wire.ChunkNotice) (Chunk, error) {
	st, ok := statuses[m.Status]
	switch {
	case !ok:
		return Chunk{}, errors.Newf("room %d notice: status %d unknown", m.Room, m.Status)
	case m.Start < 0 || m.End < m.Start || m.End > int64(c.ledger.pages)*int64(s.PageSize):
		return Chunk{}, errors.Newf("room %d notice: chunk [%d, %d) is not a range within the pool's %d pages of %d tokens", m.Room, m.Start, m.End, c.ledger.pages, s.PageSize)
	case len(m.Positions) != len(m.DstPages):
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): %d positions, %d pages", m.Room, m.Start, m.End, len(m.Positions), len(m.DstPages))
	case len(m.DstPages) > c.ledger.pages:
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): %d pages, the pool has %d", m.Room, m.Start, m.End, len(m.DstPages), c.ledger.pages)
	case len(m.Error) > maxMetadataText:
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): an error text of %d bytes (at most %d)", m.Room, m.Start, m.End, len(m.Error), maxMetadataText)
	}
	rng, err := cp.ChunkRange(int(m.Start), int(m.End), s.PageSize, m.Last)
	if err != nil {
		return Chunk{}, errors.Wrapf(err, "room %d", m.Room)
	}
	// A rank reports at most one position per page of the chunk: what the
	// room keeps of a notice is then bounded by the chunk, and its chunks
	// do not overlap. (Before its request's page count is known, the
	// contiguous rule cannot check a report's positions yet.)
	if len(m.Positions) > rng.Pages {
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): %d positions, more than its %d pages", m.Room, m.Start, m.End, len(m.Positions), rng.Pages)
	}
	// A rank that sent a chunk owns at least one of its pages, and reports
	// only those (invariant 5): a successful report of no page, or of a page
	// outside the chunk, claims no pool page, and such reports could fill
	// every room of a session up to MaxChunksPerRoom while the contiguous
	// rule cannot check them yet (its request's page count unknown). Checked
	// here, every chunk of pages admitted to a room nobody Expected claims
	// a free pool page, so the pool bounds them across the session's rooms;
	// a chunk of no page (a non-last chunk shorter than a page) claims none,
	// and the session's count of those is bounded by the pool's pages
	// (notice: csession.pageless).
	if st == messages.Succeeded && rng.Pages > 0 && len(m.Positions) == 0 {
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): a successful chunk of %d pages reported with no page", m.Room, m.Start, m.End, rng.Pages)
	}
	ch := Chunk{Room: m.Room, Start: int(m.Start), End: int(m.End), Last: m.Last, Status: st, Err: m.Error,
		NotQuiesced: m.NotQuiesced, Bytes: m.Bytes, Positions: make([]int, len(m.Positions)), DstPages: make([]int, len(m.DstPages))}
	for i, p := range m.DstPages {
		if p < 0 || p >= int64(c.ledger.pages) {
			return Chunk{}, errors.Newf("room %d chunk [%d, %d): decode page %d at index %d is outside the pool of %d pages", m.Room, m.Start, m.End, p, i, c.ledger.pages)
		}
		// A request has one distinct decode page per position, so its
		// positions are below the pool's page count.
		if m.Positions[i] < 0 || m.Positions[i] >= int64(c.ledger.pages) {
			return Chunk{}, errors.Newf("room %d chunk [%d, %d): position %d at index %d is outside the pool's %d pages", m.Room, m.Start, m.End, m.Positions[i], i, c.ledger.pages)
		}
		if m.Positions[i] < int64(rng.PageStart) || m.Positions[i] >= int64(rng.PageStart+rng.Pages) {
			return Chunk{}, errors.Newf("room %d chunk [%d, %d): position %d at index %d is outside the chunk's pages [%d, %d)", m.Room, m.Start, m.End, m.Positions[i], i, rng.PageStart, rng.PageStart+rng.Pages)
		}
		ch.Positions[i], ch.DstPages[i] = int(m.Positions[i]), int(p)
	}
	return ch, nil
}

// claim checks a chunk's pages against its room: the Expected pages, or,
// for a room nobody Expected, pages no other room holds (each position one
// page); it claims the new ones.
func (c *Core) claim(r *croom, ch Chunk) error {
	where := func(format string, args ...any) error {
		return errors.Newf("room %d chunk [%d, %d): %s", ch.Room, ch.Start, ch.End, fmt.Sprintf(format, args...))
	}
	if r.expected {
		for i, pos := range ch.Positions {
			switch {
			case pos >= len(r.pages):
				return where("position %d is beyond the room's %d pages", pos, len(r.pages))
			case r.pages[pos] != ch.DstPages[i]:
				return where("position %d went to decode page %d, the room's page is %d", pos, ch.DstPages[i], r.pages[pos])
			}
		}
		return nil
	}
	fresh := map[int]int{} // page -> position, the chunk's new ones
	for i, pos := range ch.Positions {
		p := ch.DstPages[i]
		if have, ok := r.learned[pos]; ok {
			if have != p {
				return where("position %d went to decode page %d, an earlier chunk put it on page %d", pos, p, have)
			}
			continue
		}
		if q, ok := fresh[p]; ok && q != pos || c.ledger.owner[p] == r {
			return where("decode page %d holds two positions of the room", p)
		}
		if err := c.ledger.free(p); err != nil {
			return where("%v", err)
		}
		fresh[p] = pos
	}
	for p, pos := range fresh {
		r.learned[pos] = p
		c.ledger.hold(r, p)
	}
	return nil
}
