package core

import (
	"maps"

	"github.com/cockroachdb/errors"
)

// check verifies what must hold of a core between any two messages (the
// fuzz test's oracle): the ledger's and the session table's invariants,
// every room listed under its id until released, an ended room with
// exactly one outcome, a room waiting only on sessions a revocation is
// still to clear, no session without a pool.
func (c *Core) check() error {
	if err := c.ledger.check(c.rooms); err != nil {
		return err
	}
	if err := c.sessions.check(); err != nil {
		return err
	}
	for id, r := range c.rooms {
		if r.id != id || r.released {
			return errors.Newf("room %d listed under %d (released %v)", r.id, id, r.released)
		}
	}
	for r := range c.ledger.rooms(c.rooms) {
		if r.complete && (r.err != nil || r.pendingErr != nil) {
			return errors.Newf("room %d both complete and failed", r.id)
		}
		// A room waits only on sessions whose revocation is still to
		// come: that of a session forgotten, or already revoked, never
		// would, and the room's pages would be held for ever.
		for _, set := range []map[*csession]bool{r.dirty, r.awaiting} {
			for s := range set {
				if c.sessions.get(s.Token) != s || s.revoked {
					return errors.Newf("room %d waits on session %s, which is gone or already revoked", r.id, s.Token)
				}
			}
		}
	}
	if !c.ledger.sized() && c.sessions.len() > 0 {
		return errors.Newf("%d sessions without a pool", c.sessions.len())
	}
	for s := range c.sessions.all() {
		// The session's count of pageless chunks is what its rooms not
		// forgotten hold, and within the pool's pages.
		n := 0
		for r := range s.rooms {
			n += r.pageless[s]
		}
		if n != s.pageless || s.pageless > c.ledger.pages {
			return errors.Newf("session %s counts %d pageless chunks, its rooms hold %d (the pool has %d pages)", s.Token, s.pageless, n, c.ledger.pages)
		}
	}
	if c.r.MaxRoomsPerSession > 0 {
		for s := range c.sessions.all() {
			if n := c.openRooms(s); n > c.r.MaxRoomsPerSession {
				return errors.Newf("session %s holds %d rooms, above MaxRoomsPerSession %d", s.Token, n, c.r.MaxRoomsPerSession)
			}
		}
	}
	return nil
}

// check verifies the ledger against the live rooms: every page held is
// held by one live or lingering room that lists it, within the pool, and
// not kept out; every lingering room was released.
func (l *ledger) check(live map[uint64]*croom) error {
	for p, r := range l.owner {
		switch {
		case live[r.id] != r && !l.lingering[r]:
			return errors.Newf("page %d held by room %d, which is neither live nor lingering", p, r.id)
		case l.quarantine[p]:
			return errors.Newf("page %d both held (room %d) and quarantined", p, r.id)
		case p < 0 || p >= l.pages:
			return errors.Newf("page %d held outside the pool of %d pages", p, l.pages)
		}
	}
	for r := range l.lingering {
		if !r.released {
			return errors.Newf("lingering room %d not released", r.id)
		}
	}
	for r := range l.rooms(live) {
		for _, p := range r.held {
			if l.owner[p] != r {
				return errors.Newf("room %d lists page %d, held by another", r.id, p)
			}
		}
	}
	return nil
}

// rooms is the set of the live rooms and the lingering ones.
func (l *ledger) rooms(live map[uint64]*croom) map[*croom]bool {
	rooms := maps.Clone(l.lingering)
	for r := range maps.Values(live) {
		rooms[r] = true
	}
	return rooms
}

// check verifies that every identity names an open session listed by its
// token under that identity.
func (t *sessionTable) check() error {
	for key, s := range t.byKey {
		if t.byToken[s.Token] != s || s.state != sessionOpen || s.key != key {
			return errors.Newf("identity %q names session %s in state %d", key, s.Token, s.state)
		}
	}
	return nil
}
