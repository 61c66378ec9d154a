package core

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/messages/wire"
)

// A chunk's decision: Verify's verdict on its bytes, then its room's
// group's verdict, which the serving stack and the prefill hear of.

// verified takes Verify's verdict on the pending chunk: a rejection fails
// its room.
func (c *Core) verified(m VerifiedMsg) {
	p := c.pending
	if p == nil || p.session == nil {
		c.warn("decode core: a verify result with no notice waiting")
		return
	}
	c.pending = nil
	s, r, ch := p.session, p.room, p.chunk
	if m.Err != nil {
		err := errors.Mark(errors.Wrapf(m.Err, "room %d chunk [%d, %d)%s: verify", ch.Room, ch.Start, ch.End, rankText(c.r.Group, s.Rank)), ErrChunkFailed)
		s.report.Failed++
		if s.err == nil {
			s.err = err
		}
		c.failRoom(r, err, "verify")
		c.emit(AnswerNotice{Code: wire.Code_ROOM_FAILED, Text: err.Error()})
		c.settle(r)
		return
	}
	c.emit(Verified{Bytes: ch.Bytes})
	c.answerDecided(s, r, ch)
}

// answerDecided decides a chunk and answers its notice: a successful
// chunk that failed the room (positions that are not the rank's) is the
// prefill's to hear of.
func (c *Core) answerDecided(s *csession, r *croom, ch Chunk) {
	c.decide(s, r, ch)
	if ch.Status == messages.Succeeded && r.err != nil && errors.Is(r.err, ErrChunkFailed) && !r.complete {
		c.emit(AnswerNotice{Code: wire.Code_ROOM_FAILED, Text: r.err.Error()})
		return
	}
	c.emit(AnswerNotice{})
}

// decide reports an admitted chunk to its room's group and publishes the
// verdict.
func (c *Core) decide(s *csession, r *croom, ch Chunk) {
	if r.group == nil {
		// A group of one: the session owns every page of a chunk.
		r.group = newGroupRoom(Group{Size: 1, Rule: cp.SharedKV, PageSize: s.PageSize}, r.id, len(r.pages))
	}
	if ch.NotQuiesced {
		r.dirty[s] = true
	}
	// In a group the other ranks that still owe the room may be writing
	// it when this chunk fails it: its pages wait for them too.
	var others []*csession
	if c.r.Group != nil {
		others = c.othersWriting(r, s)
	}
	switch r.group.Report(s.Rank, ch) {
	case Complete:
		r.complete = true
		s.report.Rooms++
		c.emit(RoomEnded{Room: r.snapshot(), Outcome: "complete", Instance: r.born})
		c.debug("room complete", "room", r.id, "prefill", s.Prefill)
	case Failed:
		err := r.group.err
		s.report.Failed++
		if s.err == nil {
			s.err = err
		}
		outcome := "failed"
		if ch.Status == messages.Dropped {
			outcome = "dropped"
		}
		for _, w := range others {
			r.dirty[w] = true
		}
		c.failRoom(r, err, outcome)
	}
	c.settle(r)
}
