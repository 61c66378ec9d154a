package core

import (
	"slices"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages/wire"
)

// A session's goodbye, and the Terminated of its actor, which ends a
// session that said goodbye and read its answer (and is only a suspicion
// before). The revocation that follows is in revoke.go.

// bye decides a session's verdict: rooms it leaves unfinished fail, its
// access is revoked, and the verdict is answered once that is confirmed.
func (c *Core) bye(m ByeMsg) {
	b := m.Bye
	if b == nil {
		c.emit(AnswerBye{Reply: m.Reply, Summary: &wire.Summary{Code: wire.Code_BAD_INPUT, Error: "bye: empty"}})
		return
	}
	s, why := c.sessions.sessionFor(m.From, b.Session, c.r.TLS)
	if s == nil {
		c.warn("bye refused", "node", m.From.Node, "error", why)
		c.emit(AnswerBye{Reply: m.Reply, Summary: &wire.Summary{Code: wire.Code_REFUSED, Error: "bye: " + why}})
		return
	}
	aborted := b.Aborted != ""
	var incomplete []*croom
	for r := range s.rooms {
		if r.ended() || r.released {
			continue
		}
		// A room of a group waits on other ranks too: this rank's goodbye
		// leaves it incomplete only if it still owes this rank a chunk.
		if c.r.Group == nil || aborted && r.group.Owes(s.Rank) || r.group.Missing(s.Rank) {
			incomplete = append(incomplete, r)
		}
	}
	if aborted && c.r.Group != nil {
		for _, r := range c.rooms {
			if !r.ended() && !s.rooms[r] && r.ident == s.Identity && r.group != nil && r.group.Owes(s.Rank) {
				incomplete = append(incomplete, r)
			}
		}
	}
	slices.SortFunc(incomplete, byID)
	var cause error
	switch {
	case aborted:
		text := Clip(b.Aborted, maxMetadataText)
		cause = errors.Newf("the prefill stopped early: %s", text)
	case b.Chunks != uint64(s.notices):
		cause = errors.Newf("the prefill sent %d chunk notices, %d arrived", b.Chunks, s.notices)
	case len(incomplete) > 0:
		ids := make([]uint64, len(incomplete))
		for i, r := range incomplete {
			ids[i] = r.id
		}
		cause = errors.Newf("rooms %v never received their last chunk", ids)
	}
	if cause != nil {
		cause = errors.Mark(cause, ErrSessionAborted)
		if s.err == nil {
			s.err = cause
		}
		c.warn("prefill session not complete", "prefill", s.Prefill, "error", cause.Error())
	}
	s.said = !aborted
	s.state = sessionBye
	// It sends nothing more: its identity may open a new session.
	c.sessions.retire(s)
	sum := &wire.Summary{Chunks: uint64(s.report.Chunks), Failed: uint64(s.report.Failed)}
	if s.err != nil {
		sum.Code, sum.Error = wire.Code_ROOM_FAILED, s.err.Error()
	}
	for _, r := range incomplete {
		// A prefill says goodbye after its engine stopped writing, but
		// nothing makes a peer keep its word: the pages go on only once
		// its access is revoked.
		r.dirty[s] = true
		c.failRoom(r, errors.Mark(errors.Newf("room %d: the prefill %s ended its session before the room's last chunk", r.id, s.Prefill), ErrSessionAborted), "aborted")
		c.settle(r)
	}
	// The verdict goes out once the access is revoked (revoked), so that
	// no write the prefill posts after it, or still has in flight, lands.
	s.bye = &AnswerBye{Reply: m.Reply, Summary: sum}
	c.revoke(s)
}

// departed takes a Terminated of a session's actor: a session open ends as
// lost once its grace passed, unless it speaks again meanwhile.
func (c *Core) departed(m DepartedMsg) {
	s := c.sessions.ofActor(m.Actor)
	switch {
	case s == nil:
		return
	case s.state == sessionBye && s.bye == nil:
		// It left having read its answer.
		c.end(s)
	case s.state == sessionOpen && s.departed && s.departTimer != 0:
		// Reported gone again: its grace runs from the first report.
	case s.state == sessionOpen && m.Grace <= 0:
		// Anyone holding the prefill's certificate (anyone at all, in the
		// clear) can send a Terminated: the heartbeats decide, unless the
		// session's own node says Hello again for its identity (hello).
		s.departed = true
		c.debug("prefill session actor reported gone; the session goes on while its node answers heartbeats", "prefill", s.Prefill, "actor", m.Actor)
	case s.state == sessionOpen:
		// A suspicion (anyone holding the prefill's certificate, anyone
		// at all in the clear, can send a Terminated), so the session
		// goes on, for a bound: the prefill's node answering heartbeats
		// kept a session whose actor really went (a Dial that gave up, a
		// Client closed without goodbye) open for as long as its process
		// lived, holding a place of MaxSessions, its identity, its access
		// point and its rooms. One that speaks again meanwhile is alive
		// (heard); one that does not ends as lost, its access revoked
		// first. The session's own node saying Hello again for its
		// identity ends it at once (hello).
		s.departed = true
		s.departTimer = c.arm(timer{kind: departedTimer, session: s, after: m.Grace}, m.Grace)
		c.debug("prefill session actor reported gone; the session goes on, and ends as lost unless it speaks within the grace", "prefill", s.Prefill, "actor", m.Actor, "grace", m.Grace)
	}
}

// heard takes a message of an open session: one whose actor was reported
// gone is alive after all, and its grace no longer runs.
func (c *Core) heard(s *csession) {
	if !s.departed || s.departTimer == 0 {
		return // not reported gone, or left to the heartbeats (Grace 0)
	}
	s.departed, s.departTimer = false, 0
	c.debug("prefill session speaks again after its actor was reported gone: it goes on", "prefill", s.Prefill, "actor", s.Actor)
}
