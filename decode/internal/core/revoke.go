package core

import (
	"slices"

	"github.com/cockroachdb/errors"
)

// A session's end: its access to the pool is revoked (a Revoke effect,
// answered by a RevokedMsg), and only then are its pages handed on, its
// goodbye answered and its end reported.

// revoke cuts the session's peer off the pool, once; RevokedMsg comes back.
func (c *Core) revoke(s *csession) {
	if s.revoking {
		return
	}
	s.revoking = true
	c.emit(Revoke{Session: s.Token, Lost: s.lost != nil})
}

// end ends a session: it is over once its access is revoked.
func (c *Core) end(s *csession) {
	if s.state == sessionEnding {
		return
	}
	s.state = sessionEnding
	c.sessions.retire(s)
	if s.revoked {
		c.finish(s)
		return
	}
	c.revoke(s)
}

// revoked takes the outcome of a session's revocation: the pages its peer
// could write go on (or are kept out for good when it is not confirmed),
// a goodbye is answered, and an ending session is over.
func (c *Core) revoked(m RevokedMsg) {
	s := c.sessions.get(m.Session)
	if s == nil || !s.revoking || s.revoked {
		return
	}
	s.revoked = true
	confirmed := m.Err == nil
	if !confirmed {
		c.ledger.tainted = true
		msg := "access not confirmed revoked: the pool stays registered"
		if s.lost != nil || !s.said {
			// A prefill that did not say goodbye may still be writing.
			c.warn(msg, "prefill", s.Prefill, "error", m.Err.Error())
		} else {
			c.debug(msg, "prefill", s.Prefill, "error", m.Err.Error())
		}
	}
	// The live rooms in id order, then the lingering ones.
	for _, r := range slices.Concat(c.roomsByID(), sortedRooms(c.ledger.lingering)) {
		if !r.dirty[s] && !r.awaiting[s] {
			continue
		}
		if !confirmed {
			r.poisoned = true
		}
		delete(r.dirty, s)
		delete(r.awaiting, s)
		if r.pendingErr != nil && len(r.awaiting) == 0 {
			c.publishFailure(r, r.pendingErr, "lost")
		}
		c.settle(r)
	}
	for _, r := range sortedRooms(s.rooms) {
		c.settle(r)
	}
	if s.bye != nil {
		c.emit(*s.bye)
		s.bye = nil
	}
	if s.state == sessionBye {
		// The answer is on its way: the session ends when the prefill,
		// having read it, leaves (its actor's Terminated), or after the
		// grace.
		c.arm(timer{kind: byeTimer, session: s}, c.r.ByeGrace)
		return
	}
	c.finish(s)
}

// finish reports the end of a session whose access is revoked.
func (c *Core) finish(s *csession) {
	c.sessions.remove(s)
	rep := s.report
	err := s.err
	outcome := "complete"
	switch {
	case s.lost != nil:
		outcome = "lost"
	case c.closed && !s.said && err == nil:
		err = errors.Mark(errors.New("decode server closed"), ErrClosed)
		outcome = "closed"
	case err != nil && errors.Is(err, ErrSessionAborted):
		outcome = "aborted"
	case err != nil:
		outcome = "failed"
	case s.notices == 0:
		outcome = "empty"
	}
	rep.Complete = err == nil && s.said && s.notices > 0
	rep.Empty = s.notices == 0
	c.emit(SessionEnded{Session: s.Token, Report: rep, Err: err, Outcome: outcome})
	c.debug("prefill session ended", "prefill", s.Prefill, "outcome", outcome)
	c.maybeReleasePool()
	c.maybeDrained()
}
