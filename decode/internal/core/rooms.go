package core

import (
	"cmp"
	"maps"
	"slices"

	"github.com/cockroachdb/errors"
)

// A room's life in the core: created by Expect or by a first notice,
// failed (held back while lost writers are being revoked), and settled
// once it is over and its pages are quiet.

// newRoom lists a room, Expected (pages) or created by a notice (nil): its
// timer is armed, and in a group a rank lost and not back fails it at once
// (its pages then wait for the ranks that are here).
func (c *Core) newRoom(id uint64, pages []int, from string) *croom {
	c.nextRoom++
	r := &croom{id: id, born: c.nextRoom, expected: pages != nil, pages: pages, from: from, reporters: map[*csession]bool{},
		awaiting: map[*csession]bool{}, dirty: map[*csession]bool{}}
	if !r.expected {
		r.learned = map[int]int{}
	}
	c.rooms[id] = r
	if c.r.RoomTimeout > 0 {
		r.timer = c.arm(timer{kind: roomTimer, room: r}, c.r.RoomTimeout)
	}
	if g := c.r.Group; g != nil {
		r.group = newGroupRoom(*g, id, len(pages))
		// A rank lost and not back cannot report the room's chunks. Every
		// session not yet cut off may write it all the same (a scheduler
		// may have its pages before it is Expected): its pages wait for
		// each, until it reports a chunk that ends its writes, cancels
		// the room or its access is revoked.
		for _, rank := range slices.Sorted(maps.Keys(c.sessions.lostRanks)) {
			if r.group.Lost(rank, c.sessions.lostRanks[rank]) == Failed {
				for s := range c.sessions.all() {
					if !s.revoked {
						r.dirty[s] = true
					}
				}
				c.failRoom(r, errors.Mark(r.group.err, ErrPrefillLost), "lost")
				break
			}
		}
	}
	return r
}

// failRoom decides the room failed. While lost sessions it waits for are
// being revoked the failure is held; it is published once they answered.
func (c *Core) failRoom(r *croom, err error, outcome string) {
	if r.ended() {
		return
	}
	if len(r.awaiting) > 0 {
		r.pendingErr = err
		return
	}
	c.publishFailure(r, err, outcome)
}

// publishFailure tells the serving stack a room failed, and marks it not
// quiesced when a writer's access could not be revoked.
func (c *Core) publishFailure(r *croom, err error, outcome string) {
	if r.poisoned && !errors.Is(err, ErrNotQuiesced) {
		err = errors.Mark(errors.Wrap(err, "its prefill's access could not be revoked"), ErrNotQuiesced)
	}
	r.err, r.pendingErr = err, nil
	if outcome != "released" && outcome != "closed" && outcome != "cancelled" { // not the prefill's doing, or on purpose
		for s := range r.reporters {
			if s.err == nil {
				s.err = err // a room it reported in did not complete
			}
		}
	}
	c.emit(RoomEnded{Room: r.snapshot(), Err: err, Outcome: outcome, Instance: r.born})
	c.warn("room failed", "room", r.id, "outcome", outcome, "error", err.Error())
}

// settle forgets what of a room is over: a released room (or one nobody
// Expected) whose pages are quiet frees them; one that can never be quiet
// (a revocation not confirmed) puts them in quarantine.
func (c *Core) settle(r *croom) {
	done := r.released || !r.expected && (r.complete || r.err != nil)
	if !done || len(r.dirty) > 0 || len(r.awaiting) > 0 || r.pendingErr != nil {
		return
	}
	n := c.ledger.settle(r)
	if n > 0 {
		c.emit(Quarantined{Pages: n})
		c.warn("pages kept out for good: a prefill that may still write them could not be cut off", "room", r.id, "pages", n)
	}
	if r.cancelling {
		r.cancelling = false
		c.emit(CancelSettled{Room: r.id, Instance: r.born, NotQuiesced: n > 0})
	}
	if c.rooms[r.id] == r {
		delete(c.rooms, r.id)
	}
	for s := range r.reporters {
		s.pageless -= r.pageless[s]
		delete(s.rooms, r)
		if !r.expected && !r.released {
			if len(s.ended) >= c.r.MaxRoomsPerSession {
				s.ended = s.ended[1:]
			}
			s.ended = append(s.ended, r.id)
		}
	}
	c.maybeReleasePool()
}

// roomsByID lists the rooms in id order (effects come out in a stable
// order).
func (c *Core) roomsByID() []*croom {
	return slices.SortedFunc(maps.Values(c.rooms), byID)
}

// sortedRooms lists a set of rooms (the lingering ones, a session's) by id,
// rooms of one id in the order they were created: the effects they
// produce come out in the same order whenever the same messages are
// stepped in, so that a replay returns what the recording did.
// lingeringOf lists, in id order, the lingering rooms of id room that
// match: found before they are sorted, so that a peer's message about a
// room not live (the first notice of a room not yet expected, a cancel, or
// a guess) costs no sort of every lingering room, and no allocation when
// none matches.
func (l *ledger) lingeringOf(room uint64, match func(*croom) bool) []*croom {
	var rs []*croom
	for r := range l.lingering {
		if r.id == room && match(r) {
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, byID)
	return rs
}

func sortedRooms(set map[*croom]bool) []*croom {
	return slices.SortedFunc(maps.Keys(set), byID)
}

func byID(a, b *croom) int { return cmp.Or(cmp.Compare(a.id, b.id), cmp.Compare(a.born, b.born)) }
