package core

import (
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages/wire"
)

// Cancelling a room, in both directions. The decode side (Server.Cancel)
// gives a room up: the room fails (ErrCancelled) and is released at once,
// every session that may write it is told (TellCancel) and its pages stay
// out of new rooms until each answered that its writes stopped (its Cancel)
// or its access was revoked; then CancelSettled. The prefill side cancels
// a room after its engine's Drop returned (its Cancel): the room fails
// (ErrCancelled), its pages quiet unless the prefill says otherwise. A
// room has one outcome whichever comes first: a room that completed stays
// complete, and a room cancelled by one side is cancelled for the other.

// maxReason bounds the reason a peer's Cancel carries, as logged and kept
// in the room's error.
const maxReason = 1024

// cancelRoom is Server.Cancel.
func (c *Core) cancelRoom(m CancelRoomMsg) {
	r := c.rooms[m.Room]
	if r == nil {
		for lr := range c.ledger.lingering {
			if lr.id == m.Room && errors.Is(lr.err, ErrCancelled) {
				// Cancelled and released already: one outcome.
				c.emit(Reply{Err: BadInput("room %d: already cancelled", m.Room)})
				return
			}
		}
		c.emit(Reply{Err: BadInput("room %d is unknown (never Expected, released, or forgotten)", m.Room)})
		return
	}
	if r.ended() && !errors.Is(r.err, ErrCancelled) && !errors.Is(r.pendingErr, ErrCancelled) {
		// It completed or failed first: that is its outcome.
		what := "complete"
		if !r.complete {
			what = "failed"
		}
		c.emit(Reply{Err: BadInput("room %d already ended (%s): nothing to cancel", m.Room, what)})
		return
	}
	cause := m.Cause
	if cause == "" {
		cause = "no reason given"
	}
	if !r.ended() {
		c.failRoom(r, errors.Mark(errors.Newf("room %d cancelled by the decode server: %s", r.id, cause), ErrCancelled), "cancelled")
		c.emit(Cancelled{Room: r.id, Direction: "decode"})
		for _, s := range c.writers(r) {
			r.dirty[s] = true
			if s.state == sessionOpen {
				c.emit(TellCancel{Session: s.Token, Room: r.id, Reason: cause})
			}
		}
	}
	// Released at once: its id may be Expected again, its pages go back
	// once no write of it can land (settle).
	delete(c.rooms, r.id)
	r.released, r.cancelling = true, true
	c.ledger.linger(r)
	c.emit(Reply{Instance: r.born})
	c.settle(r)
}

// cancel takes a prefill's Cancel: its answer to the server's, or a room
// it cancelled.
func (c *Core) cancel(m CancelMsg) {
	k := m.Cancel
	if k == nil {
		c.refuseCancel(wire.Code_BAD_INPUT, "bad_input", "cancel: empty")
		return
	}
	s, why := c.sessions.sessionFor(m.From, k.Session, c.r.TLS)
	if s == nil {
		c.refuseCancel(wire.Code_REFUSED, "not_session", fmt.Sprintf("room %d cancel: %s", k.Room, why))
		return
	}
	c.heard(s)
	reason := Clip(k.Reason, maxReason)
	if reason == "" {
		reason = "no reason given"
	}
	// The answer to the server's Cancel, or a cancel of a room released
	// since it failed: the room is released, waiting for this session's
	// writes to stop.
	if rs := c.ledger.lingeringOf(k.Room, func(r *croom) bool { return r.dirty[s] }); len(rs) > 0 {
		r := rs[0] // the earliest, where rooms reused its id
		if k.NotQuiesced {
			// Its pages wait for the session's access to be revoked.
			c.warn("cancelled room: the prefill could not stop its writes", "room", r.id, "prefill", s.Prefill, "reason", reason)
		} else {
			delete(r.dirty, s)
		}
		c.emit(AnswerCancel{Code: wire.Code_OK})
		c.settle(r)
		return
	}
	r := c.rooms[k.Room]
	switch {
	case r == nil:
		// Nothing of it is held: never Expected nor reported, released,
		// or settled already (its last chunk, which crossed the server's
		// cancel, said its writes stopped).
		c.debug("cancel of a room not held: nothing to do", "room", k.Room, "prefill", s.Prefill)
		c.emit(AnswerCancel{Code: wire.Code_OK})
		return
	case r.ident != "" && r.ident != s.Identity || r.from != "" && r.from != s.Identity:
		c.refuseCancel(wire.Code_REFUSED, "not_owner", fmt.Sprintf("room %d cancel: the room is another prefill's", k.Room))
		return
	case r.ended():
		// Complete, failed or cancelled first: its outcome stays. A quiet
		// cancel (an answer to another rank's, or this identity's other
		// session's, or of a room another rank's loss failed) says this
		// session's writes stopped.
		switch {
		case k.NotQuiesced && !r.complete:
			r.dirty[s] = true
		case r.dirty[s]:
			delete(r.dirty, s)
			c.settle(r)
		}
		c.emit(AnswerCancel{Code: wire.Code_OK})
		return
	}
	// Every other session that may write it (the other ranks of a group,
	// the identity's other sessions) may still be writing: its pages wait
	// for each to say its writes stopped (its Cancel or its final notice)
	// or to be cut off, as after a timeout.
	for _, w := range c.othersWriting(r, s) {
		r.dirty[w] = true
	}
	if k.NotQuiesced {
		r.dirty[s] = true
	}
	c.failRoom(r, errors.Mark(errors.Newf("room %d cancelled by the prefill %s: %s", r.id, s.Prefill, reason), ErrCancelled), "cancelled")
	c.emit(Cancelled{Room: r.id, Direction: "prefill"}, AnswerCancel{Code: wire.Code_OK})
	c.settle(r)
}

// refuseCancel answers a prefill's Cancel with a refusal.
func (c *Core) refuseCancel(code wire.Code, reason, text string) {
	c.warn("cancel refused", "reason", reason, "error", text)
	c.emit(AnswerCancel{Code: code, Reason: reason, Text: text})
}
