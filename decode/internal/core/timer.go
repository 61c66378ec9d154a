package core

import (
	"time"

	"github.com/cockroachdb/errors"
)

// The core reads no clock: it asks the shell for a timer (ArmTimer) and
// hears of it firing (TimerMsg).

type timerKind int

const (
	roomTimer     timerKind = iota // a room's RoomTimeout
	byeTimer                       // a session's ByeGrace after its goodbye was answered
	departedTimer                  // a session's grace after its actor was reported gone
)

// timer is what an armed timer is for.
type timer struct {
	kind    timerKind
	room    *croom
	session *csession
	after   time.Duration
}

// arm asks the shell for a TimerMsg after the given time, and returns its
// id.
func (c *Core) arm(t timer, after time.Duration) uint64 {
	c.nextTimer++
	c.timers[c.nextTimer] = t
	c.emit(ArmTimer{ID: c.nextTimer, After: after})
	return c.nextTimer
}

// timerFired fails a room past RoomTimeout (its writers may still write),
// ends a session that said goodbye and did not leave within ByeGrace, and
// one whose actor was reported gone and that said nothing since within its
// grace (as lost).
func (c *Core) timerFired(m TimerMsg) {
	t, ok := c.timers[m.ID]
	if !ok {
		return
	}
	delete(c.timers, m.ID)
	switch t.kind {
	case roomTimer:
		r := t.room
		if r.ended() || r.released || c.rooms[r.id] != r {
			return
		}
		// Ranks that did not report may still be writing; not one whose
		// access is revoked already (it said Bye and waits out ByeGrace):
		// no revocation would come to clear its mark, and the room's pages
		// would be held for ever.
		for s := range c.sessions.all() {
			if s.state != sessionEnding && !s.revoked && (c.r.Group != nil || r.reporters[s] || s.Identity == r.ident || r.ident == "" && (r.from == "" || s.Identity == r.from)) {
				r.dirty[s] = true
			}
		}
		c.failRoom(r, errors.Mark(errors.Mark(errors.Newf("room %d: not complete within %v (Config.RoomTimeout)", r.id, c.r.RoomTimeout), ErrChunkFailed), ErrNotQuiesced), "timeout")
		c.settle(r)
	case byeTimer:
		if s := t.session; c.sessions.get(s.Token) == s && s.state == sessionBye {
			c.end(s)
		}
	case departedTimer:
		if s := t.session; c.sessions.get(s.Token) == s && s.state == sessionOpen && s.departed && s.departTimer == m.ID {
			// Nothing but its node's heartbeats kept it open: a Dial that
			// gave up on its Hello, a Client closed without goodbye. It
			// held a place of MaxSessions, its identity and its access
			// point for as long as its process lived.
			c.peerLost(PeerLostMsg{Session: s.Token, Cause: errors.Newf("its session actor %s went away, and the session said nothing for %v since", s.Actor, t.after)})
		}
	}
}
