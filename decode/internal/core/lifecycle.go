package core

import "github.com/cockroachdb/errors"

// The serving stack's calls on the whole server: its state, Drain and
// Close, and what follows the last session's end (the pool released, the
// server drained).

// state is what the core holds now (Server.State).
func (c *Core) state() State {
	s := State{Sessions: c.sessions.open(), Rooms: len(c.rooms), Pooled: c.ledger.sized(), Draining: c.draining, Closed: c.closed,
		Quarantined: len(c.ledger.quarantine), Tainted: c.ledger.tainted, PagesHeld: len(c.ledger.owner)}
	for _, b := range c.ledger.pool {
		s.PoolBytes += b.ItemLen * uint64(b.Pages)
	}
	for _, r := range c.ledger.owner {
		if (r.released || r.ended()) && !r.quiet() {
			s.PagesAwaitingRevocation++
		}
	}
	for _, r := range c.rooms {
		if !r.ended() && !r.released {
			s.RoomsInFlight++
		}
	}
	return s
}

// State is what the core holds now, for gauges: read without a message,
// so that a trace of the core's messages does not record each reading.
func (c *Core) State() State { return c.state() }

// drain stops taking sessions; the sessions that are open go on, and each
// is told so once (TellDrain), so that its prefill winds it down.
func (c *Core) drain() {
	if !c.draining && !c.closed {
		for _, s := range c.sessions.sorted() {
			if s.state == sessionOpen {
				c.emit(TellDrain{Session: s.Token})
			}
		}
	}
	c.draining = true
	c.emit(Reply{Drained: c.sessions.len() == 0})
	c.maybeDrained()
}

// close ends every room and session: the rooms not ended fail, and every
// session ends once its access is revoked.
func (c *Core) close() {
	if c.closed {
		c.emit(Reply{})
		return
	}
	c.closed = true
	cause := errors.Mark(errors.New("decode server closed"), ErrClosed)
	for _, r := range c.roomsByID() {
		if !r.ended() {
			c.failRoom(r, cause, "closed")
		}
	}
	for _, s := range c.sessions.sorted() {
		// Open sessions' rooms failed above; their pages are quiet once the
		// access is revoked.
		for r := range s.rooms {
			if s.state == sessionOpen && !r.complete {
				r.dirty[s] = true
			}
		}
		c.end(s)
	}
	c.emit(Reply{Drained: c.sessions.len() == 0})
	c.maybeReleasePool()
	c.maybeDrained()
}

// maybeReleasePool releases a pool nobody holds: one a Hello sized, once no
// session and no room holds it; any, once closed. Never while a page may
// still be written.
func (c *Core) maybeReleasePool() {
	if !c.ledger.releasable() || c.sessions.len() > 0 || c.pending != nil {
		return
	}
	switch {
	case c.closed:
		for _, r := range c.rooms {
			if !r.quiet() {
				return
			}
		}
	case c.r.Size && len(c.rooms) == 0:
	default:
		return
	}
	// The pool goes with its pages: a closed core's rooms (kept for Lookup)
	// hold none of them any more.
	for _, r := range c.rooms {
		r.held = nil
	}
	c.ledger.release(c.r.PageSize)
	c.emit(ReleasePool{})
}

// maybeDrained says so once draining (or closed) and no session is left.
func (c *Core) maybeDrained() {
	if (c.draining || c.closed) && c.sessions.len() == 0 {
		c.emit(Drained{})
	}
}
