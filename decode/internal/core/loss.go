package core

import "github.com/cockroachdb/errors"

// A session is lost on evidence only: its node's heartbeats went silent
// (PeerLostMsg), the serving stack cut its identity off (Disconnect), or
// its actor was reported gone and it said nothing since for its grace
// (timer.go: departedTimer).

// disconnect cuts every session of an identity off as if lost.
func (c *Core) disconnect(m DisconnectMsg) {
	ss := c.sessions.ofIdentity(m.Identity)
	if len(ss) == 0 {
		c.emit(Reply{Err: BadInput("no session of prefill %q", m.Identity)})
		return
	}
	c.emit(Reply{})
	cause := m.Cause
	if cause == nil {
		cause = errors.New("disconnected by the decode server")
	}
	for _, s := range ss {
		c.peerLost(PeerLostMsg{Session: s.Token, Cause: cause})
	}
}

// peerLost ends a lost session: the rooms that still need it fail once
// its access is revoked (in a group, their pages also wait for the other
// ranks that still owe them), and in a group its rank, unless another
// session holds it, fails the new rooms that need it until it is back. A
// session that said goodbye just ends.
func (c *Core) peerLost(m PeerLostMsg) {
	s := c.sessions.get(m.Session)
	if s == nil || s.state == sessionEnding {
		return
	}
	if s.state == sessionBye {
		c.end(s)
		return
	}
	cause := m.Cause
	if cause == nil {
		cause = errors.New("no heartbeat answer")
	}
	lost := errors.Mark(errors.Wrapf(cause, "prefill %s (%s) lost", s.Prefill, s.Node), ErrPrefillLost)
	s.lost = lost
	if s.err == nil {
		s.err = lost
	}
	c.warn("prefill lost", "prefill", s.Prefill, "node", s.Node, "error", cause.Error())
	if c.r.Group != nil && !c.sessions.rankBack(s) {
		c.sessions.lostRanks[s.Rank] = lost
	}
	// Every room that still needs the session fails, once its access is
	// revoked: the failure then says whether its pages are quiet.
	for _, r := range c.roomsByID() {
		if r.ended() {
			continue
		}
		needs := false
		if c.r.Group != nil {
			needs = r.group.Owes(s.Rank) // whether or not it reported in it yet
		} else {
			needs = s.rooms[r]
		}
		if needs {
			// In a group the other ranks that still owe the room may be
			// writing it (their scheduler has its pages): its pages wait
			// for each of them too, as after a failed chunk or a timeout,
			// until it reports a chunk that ends its writes, cancels the
			// room or is cut off. Asked before the room fails, while the
			// group still says who owes.
			if c.r.Group != nil {
				for _, w := range c.othersWriting(r, s) {
					r.dirty[w] = true
				}
			}
			r.awaiting[s] = true
			r.dirty[s] = true
			c.failRoom(r, errors.Mark(errors.Wrapf(lost, "room %d", r.id), ErrPrefillLost), "lost")
		}
	}
	c.end(s)
}
