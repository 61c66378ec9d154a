package decode

import (
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// groupRank reads a Hello's CP rank when the server serves a group: a
// session without one could not be told apart from its group's other
// ranks. Called with s.mu held.
func (s *Server) groupRank(m *wire.Hello) (int, *wire.Offer) {
	if s.cfg.Group == nil {
		return 0, nil
	}
	text, ok := m.Metadata[RankKey]
	rank, err := strconv.Atoi(text)
	if !ok || err != nil || rank < 0 || rank >= s.cfg.Group.Size {
		s.log.Warn("hello refused: no CP rank", zap.String("prefill", m.Prefill), zap.String("rank", text))
		return 0, refuse(wire.Code_BAD_INPUT, "hello from %q: metadata %s = %q: this decode server serves a CP group of %d ranks, want a rank in [0, %d)",
			m.Prefill, RankKey, text, s.cfg.Group.Size, s.cfg.Group.Size)
	}
	delete(s.lostRanks, rank) // back: new rooms may count on it again
	return rank, nil
}

// groupNotice is notice for a server that serves a CP group: a room takes
// reports from every rank's session and completes when GroupRoom says so.
// Called with s.mu held; it unlocks it.
func (s *Server) groupNotice(ss *Session, m *wire.ChunkNotice) *wire.NoticeAck {
	c, err := s.check(m)
	r := s.rooms[m.Room]
	switch {
	case err != nil && r == nil:
		return s.refuseNotice(ss, m, wire.Code_BAD_INPUT, err)
	case r == nil && !s.cfg.AcceptUnknownRooms:
		err := errors.Newf("room %d is unknown to the decode server (not Expected)", m.Room)
		return s.refuseNotice(ss, m, wire.Code_BAD_INPUT, err)
	case r == nil:
		r = &room{Room: Room{ID: m.Room}, done: make(chan struct{})}
		r.group, _ = NewGroupRoom(*s.cfg.Group, m.Room, 0) // the Group was validated by New
		s.rooms[m.Room] = r
		s.watchRoom(r)
		s.groupRoomStarted(r)
	case r.terminal():
		err := errors.Newf("room %d chunk [%d, %d) rank %d: the room already ended (complete: %v)", m.Room, m.Start, m.End, ss.rank, r.Complete)
		return s.refuseNotice(ss, m, wire.Code_BAD_INPUT, err)
	}
	if r.reporters == nil {
		r.reporters = map[*Session]bool{}
	}
	r.reporters[ss] = true
	if refused := s.admit(ss, m, r, c, err); refused != nil {
		return refused
	}

	// Bytes first: a rank's success counts only once its pages hold what
	// they must.
	var verr error
	if c.Status == system.Succeeded && s.cfg.Verify != nil {
		if verr = s.cfg.Verify(ss, c); verr != nil {
			verr = errors.Mark(errors.Wrapf(verr, "room %d chunk [%d, %d) rank %d: verify", c.Room, c.Start, c.End, ss.rank), ErrChunkFailed)
		}
	}
	s.mu.Lock()
	var v Verdict
	if verr != nil {
		r.fail(verr)
		v = Failed
	} else {
		v = r.group.Report(ss.rank, c)
	}
	complete := false
	switch {
	case v == Failed && !r.terminal():
		r.fail(r.group.err)
	case v == Complete && !r.terminal():
		r.Complete, complete = true, true
		close(r.done)
	}
	roomErr := r.err
	s.mu.Unlock()

	ss.mu.Lock()
	ss.report.Chunks++
	failed := c.Status != system.Succeeded || verr != nil || v == Failed
	if failed {
		ss.report.Failed++
		if ss.err == nil {
			ss.err = roomErr
		}
	}
	if complete {
		ss.report.Rooms++
	}
	ss.mu.Unlock()
	if failed {
		s.log.Warn("room failed", zap.Uint64("room", c.Room), zap.Int("start", c.Start), zap.Int("end", c.End),
			zap.Int("rank", ss.rank), zap.String("prefill", ss.prefill), zap.Error(roomErr))
	}
	if verr != nil {
		return ack(wire.Code_ROOM_FAILED, "%v", verr)
	}
	return &wire.NoticeAck{}
}

// groupRoomStarted bounds a new group room by the RoomTimeout and fails it
// at once if it needs a rank that was lost and has not come back: a room
// the ranks announce after the loss would otherwise wait for it. Called
// with s.mu held.
func (s *Server) groupRoomStarted(r *room) {
	for rank, cause := range s.lostRanks {
		if r.group.Lost(rank, cause) == Failed {
			r.fail(r.group.err)
			return
		}
	}
	if t := s.cfg.Group.RoomTimeout; t > 0 {
		time.AfterFunc(t, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !r.terminal() {
				r.fail(errors.Mark(errors.Newf("room %d: not complete within %v (Group.RoomTimeout)", r.ID, t), ErrChunkFailed))
				s.log.Warn("room failed: timeout", zap.Uint64("room", r.ID), zap.Duration("timeout", t))
			}
		})
	}
}

// groupBye lists the rooms a rank's goodbye leaves incomplete: those that
// still miss a chunk it owns pages of, or, when it stopped early, any it
// may still owe. Rooms that wait on other ranks are theirs to finish.
// Called with s.mu held.
func (s *Server) groupBye(ss *Session, aborted bool) []uint64 {
	var out []uint64
	for id, r := range s.rooms {
		if r.group == nil || r.terminal() {
			continue
		}
		if aborted && r.group.Owes(ss.rank) || r.reporters[ss] && r.group.Missing(ss.rank) {
			out = append(out, id)
		}
	}
	return out
}

// groupLost fails every room that still needs the lost rank, whether or
// not it reported in it yet. Called with s.mu held.
func (s *Server) groupLost(ss *Session, who *actor.PID, lost error) {
	live := false
	for _, o := range s.sessions {
		live = live || o != ss && o.rank == ss.rank
	}
	if !live {
		if s.lostRanks == nil {
			s.lostRanks = map[int]error{}
		}
		s.lostRanks[ss.rank] = lost
	}
	for _, r := range s.rooms {
		if r.group == nil || r.terminal() {
			continue
		}
		if r.group.Lost(ss.rank, lost) == Failed {
			r.fail(r.group.err)
			s.log.Warn("room failed: rank lost", zap.Uint64("room", r.ID), zap.Int("rank", ss.rank), zap.Stringer("session", who))
		}
	}
}
