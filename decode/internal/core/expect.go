package core

import (
	"maps"
	"slices"

	"github.com/cockroachdb/errors"
)

// The serving stack's calls per room: Expect, Release, and Lookup (the
// first half of Wait).

// expect declares a room on pages that are free, or says why not; nothing
// changes on error.
func (c *Core) expect(m ExpectMsg) {
	reply := func(err error) { c.emit(Reply{Err: err}) }
	switch {
	case c.closed:
		reply(ClosedError("Expect"))
		return
	case !c.ledger.sized():
		reply(BadInput("room %d: the decode pool is not sized yet", m.Room))
		return
	case len(m.Pages) == 0:
		reply(BadInput("room %d: no pages", m.Room))
		return
	case len(m.From) > MaxNameLen:
		reply(BadInput("room %d: prefill identity of %d bytes (at most %d)", m.Room, len(m.From), MaxNameLen))
		return
	case c.rooms[m.Room] != nil:
		reply(BadInput("room %d is already expected: Release it first", m.Room))
		return
	}
	seen := make(map[int]int, len(m.Pages))
	for i, p := range m.Pages {
		if p < 0 || p >= c.ledger.pages {
			reply(BadInput("room %d: page %d at index %d is outside the pool of %d pages", m.Room, p, i, c.ledger.pages))
			return
		}
		if j, dup := seen[p]; dup {
			reply(BadInput("room %d: page %d at index %d duplicates index %d", m.Room, p, i, j))
			return
		}
		if err := c.ledger.free(p); err != nil {
			reply(errors.Mark(errors.Wrapf(err, "room %d: page at index %d", m.Room, i), ErrBadInput))
			return
		}
		seen[p] = i
	}
	r := c.newRoom(m.Room, slices.Clone(m.Pages), m.From)
	c.ledger.hold(r, m.Pages...)
	reply(nil)
}

// release forgets a room; one in progress fails, and its pages linger
// until whoever may still write them stopped.
func (c *Core) release(m ReleaseMsg) {
	r := c.rooms[m.Room]
	if r == nil {
		c.emit(Reply{Err: BadInput("room %d is unknown", m.Room)})
		return
	}
	if !r.ended() {
		c.failRoom(r, errors.Mark(errors.Mark(errors.Newf("room %d released while in progress", r.id), ErrBadInput), ErrChunkFailed), "released")
		for _, s := range c.writers(r) {
			r.dirty[s] = true
		}
	}
	delete(c.rooms, r.id)
	r.released = true
	c.ledger.linger(r)
	c.emit(Reply{})
	c.settle(r)
}

// othersWriting are the sessions other than s that may still write a
// room in progress that s ends (its cancel, its failed chunk): its writers
// less, in a group, the ranks that owe it no report any more (each
// reported its chunks once their writes stopped). Called before the room
// fails, while the group still says who owes.
func (c *Core) othersWriting(r *croom, s *csession) []*csession {
	var out []*csession
	for _, w := range c.writers(r) {
		if w == s || c.r.Group != nil && r.group != nil && !r.group.Owes(w.Rank) {
			continue
		}
		out = append(out, w)
	}
	return out
}

// writers are the sessions, not ending and not cut off yet, that may still
// write a room in progress, by token: its reporters, the sessions of the
// identity it was Expected from, or, with neither (or in a group, whose
// ranks all write), every open one. A session whose access is revoked
// writes nothing, and no revocation would come to clear it.
func (c *Core) writers(r *croom) []*csession {
	set := maps.Clone(r.reporters)
	for s := range c.sessions.all() {
		if s.state == sessionEnding {
			continue
		}
		if c.r.Group != nil || r.from != "" && s.Identity == r.from || r.from == "" && len(r.reporters) == 0 {
			set[s] = true
		}
	}
	var out []*csession
	for s := range set {
		if s.state != sessionEnding && !s.revoked {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, byToken)
	return out
}

// lookup answers the room now, and whether it ended.
func (c *Core) lookup(m LookupMsg) {
	r := c.rooms[m.Room]
	if r == nil {
		c.emit(Reply{Err: BadInput("room %d is unknown: Expect it first", m.Room)})
		return
	}
	c.emit(Reply{Room: r.snapshot(), Err: r.err, Ended: r.complete || r.err != nil, Instance: r.born})
}
