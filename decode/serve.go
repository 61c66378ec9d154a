package decode

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/netsec"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// ProtocolVersion is the control protocol version this package speaks
// (messages/wire: Hello.version, Offer.version).
const ProtocolVersion = uint32(wire.Version_VERSION_CURRENT)

// receive is the server's actor: every control message is validated before
// it sizes or changes anything, and answered.
func (s *Server) receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *wire.Hello:
		offer, ss := s.hello(ctx.Sender(), netsec.PeerName(ctx), m)
		if ss != nil {
			// The prefill's session actor going away ends the session (the
			// request's sender is a short-lived future); so does its node
			// no longer answering heartbeats (a hung process keeps its
			// connections open).
			ctx.Watch(actor.NewPID(m.SessionAddress, m.SessionId))
			s.watchHeartbeats(ss, ctx.Sender().Address)
		}
		ctx.Respond(offer)
	case *wire.ChunkNotice:
		ctx.Respond(s.notice(ctx.Sender(), netsec.PeerName(ctx), m))
	case *wire.Bye:
		ctx.Respond(s.bye(ctx.Sender(), netsec.PeerName(ctx), m))
	case *actor.Terminated:
		// Only the watched session actors end sessions: left ignores any
		// other PID. With TLS, a Terminated passed CheckSender (its actor
		// is on a host the sender's certificate names) and the session
		// policy (the bound peer only).
		s.left(m.Who, nil)
	case heartbeatLost:
		s.left(actor.NewPID("", ""), &m)
	}
}

// heartbeatLost is the local message a session's heartbeat monitor sends
// when the prefill's node stopped answering.
type heartbeatLost struct {
	session *Session
	err     error
}

func (s *Server) watchHeartbeats(ss *Session, prefillAddr string) {
	hb, err := s.node.watchPeer(prefillAddr, "kvstream-decode-hb-"+ss.token[:16], func(err error) {
		s.node.system.Root.Send(s.pid, heartbeatLost{session: ss, err: err})
	})
	if err != nil {
		s.log.Warn("prefill session without heartbeats", zap.String("prefill", ss.prefill), zap.Error(err))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.heartbeat = hb; s.sessions[ss.token] != ss {
		// Ended meanwhile.
		go hb.stop()
		ss.heartbeat = nil
	}
}

func refuse(code wire.Code, format string, args ...any) *wire.Offer {
	return &wire.Offer{Version: ProtocolVersion, Code: code, Error: fmt.Sprintf(format, args...)}
}

// Bounds on a Hello's free-form fields, which are logged and kept for the
// session.
const (
	maxNameLen      = 256
	maxMetadata     = 64
	maxMetadataText = 4096
)

// checkHello checks what of a Hello needs no pool: names, metadata, item
// lengths.
func checkHello(m *wire.Hello) error {
	if len(m.Prefill) > maxNameLen || len(m.SessionId) > maxNameLen || len(m.SessionAddress) > maxNameLen {
		return errors.Newf("prefill name, session id or address longer than %d bytes", maxNameLen)
	}
	if len(m.Metadata) > maxMetadata {
		return errors.Newf("%d metadata entries: at most %d", len(m.Metadata), maxMetadata)
	}
	for k, v := range m.Metadata {
		if len(k)+len(v) > maxMetadataText {
			return errors.Newf("metadata entry %.32q: more than %d bytes", k, maxMetadataText)
		}
	}
	for i, b := range m.Buffers {
		switch {
		case b == nil:
			return errors.Newf("buffer %d: missing", i)
		case len(b.Name) > maxNameLen:
			return errors.Newf("buffer %d: name longer than %d bytes", i, maxNameLen)
		case b.ItemLen == 0:
			return errors.Newf("buffer %d (%.64s): zero item length", i, b.Name)
		}
	}
	return nil
}

// layoutBytes is what a pool of the layout's geometry takes, or an error
// when it exceeds limit (products and sums checked for overflow).
func layoutBytes(layout []PrefillBuffer, limit uint64) error {
	var total uint64
	for i, b := range layout {
		if b.Pages == 0 || b.ItemLen > limit/b.Pages {
			return errors.Newf("buffer %d (%.64s): %d pages of %d bytes: more than the pool's bound of %d bytes (Config.MaxPoolBytes)", i, b.Name, b.Pages, b.ItemLen, limit)
		}
		if b.ItemLen*b.Pages > limit-total {
			return errors.Newf("%d buffers: more than the pool's bound of %d bytes (Config.MaxPoolBytes)", len(layout), limit)
		}
		total += b.ItemLen * b.Pages
	}
	return nil
}

// hello answers a Hello from sender, whose verified certificate name is
// peer ("" in the clear). It returns the session it opened, if any.
func (s *Server) hello(sender *actor.PID, peer string, m *wire.Hello) (*wire.Offer, *Session) {
	switch {
	case m.Version != ProtocolVersion:
		s.log.Warn("hello refused: protocol version", zap.String("prefill", m.Prefill), zap.Uint32("version", m.Version))
		return refuse(wire.Code_VERSION, "hello from %q: protocol version %d, this decode server speaks %d", m.Prefill, m.Version, ProtocolVersion), nil
	case sender == nil || m.SessionId == "" || sender.Address != m.SessionAddress:
		return refuse(wire.Code_REFUSED, "hello from %q: its session actor %s/%s is not on the sender's node", m.Prefill, m.SessionAddress, m.SessionId), nil
	case len(m.Buffers) == 0 || len(m.Buffers) > maxBuffers:
		return refuse(wire.Code_BAD_INPUT, "hello from %q: %d buffers (want 1 to %d)", m.Prefill, len(m.Buffers), maxBuffers), nil
	}
	if err := checkHello(m); err != nil {
		s.log.Warn("hello refused", zap.String("node", sender.Address), zap.Error(err))
		return refuse(wire.Code_BAD_INPUT, "hello: %v", err), nil
	}
	layout := make([]PrefillBuffer, len(m.Buffers))
	for i, b := range m.Buffers {
		layout[i] = PrefillBuffer{Name: b.Name, Layer: int(b.Layer), ItemLen: b.ItemLen, Pages: b.Pages}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return refuse(wire.Code_REFUSED, "the decode server is closed"), nil
	case len(s.sessions) >= s.cfg.MaxSessions:
		return refuse(wire.Code_REFUSED, "hello from %q: already %d sessions (Config.MaxSessions)", m.Prefill, len(s.sessions)), nil
	}
	if len(s.cfg.Prefills) > 0 && !slices.Contains(s.cfg.Prefills, peer) {
		s.log.Warn("hello refused: peer", zap.String("prefill", m.Prefill), zap.String("peer", peer), zap.String("node", sender.Address))
		return refuse(wire.Code_REFUSED, "hello from %q: peer %q is not a prefill this decode server serves", m.Prefill, peer), nil
	}
	// Bind before anything is sized or offered: the worker address and
	// the keys go only to the peer the session is bound to.
	if err := s.node.bind(peer); err != nil {
		s.log.Warn("hello refused: peer", zap.String("prefill", m.Prefill), zap.String("peer", peer), zap.String("node", sender.Address), zap.Error(err))
		return refuse(wire.Code_REFUSED, "hello from %q: %v", m.Prefill, err), nil
	}
	bound := false
	defer func() {
		if !bound {
			s.node.unbind(peer)
		}
	}()
	// Only a peer the session may be bound to reaches the serving stack's
	// check, and nothing is sized for a Hello it refuses.
	if s.cfg.Admit != nil {
		if err := s.cfg.Admit(m.Prefill, maps.Clone(m.Metadata)); err != nil {
			s.log.Warn("hello refused: not admitted", zap.String("prefill", m.Prefill), zap.String("node", sender.Address), zap.Error(err))
			return refuse(wire.Code_BAD_INPUT, "hello from %q: %v", m.Prefill, err), nil
		}
	}
	if s.regions == nil {
		err := layoutBytes(layout, s.cfg.MaxPoolBytes)
		var bufs []Buffer
		if err == nil {
			bufs, err = s.cfg.Size(slices.Clone(layout))
		}
		if err == nil {
			err = matchLayout(bufs, layout) // before anything is registered
		}
		if err == nil {
			err = s.size(bufs)
		}
		if err != nil {
			s.log.Warn("hello refused: sizing the pool", zap.String("prefill", m.Prefill), zap.Error(err))
			return refuse(wire.Code_BAD_INPUT, "hello from %q: sizing the decode pool: %v", m.Prefill, err), nil
		}
	}
	if err := matchLayout(s.bufs, layout); err != nil {
		s.log.Warn("hello refused: geometry", zap.String("prefill", m.Prefill), zap.Error(err))
		return refuse(wire.Code_BAD_INPUT, "hello from %q: %v", m.Prefill, err), nil
	}
	rank, refused := s.groupRank(m)
	if refused != nil {
		return refused, nil
	}
	watch := actor.NewPID(m.SessionAddress, m.SessionId)
	if s.watched[watch.String()] != nil {
		return refuse(wire.Code_REFUSED, "hello from %q: its session actor %s already has a session", m.Prefill, watch), nil
	}
	ss := &Session{token: newToken(), prefill: m.Prefill, peer: peer, addr: sender.Address, metadata: m.Metadata,
		done: make(chan struct{}), watch: watch.String(), rank: rank}
	ss.report.Prefill = m.Prefill
	s.sessions[ss.token] = ss
	s.watched[ss.watch] = ss
	s.accepted = append(s.accepted, ss)
	close(s.acceptCh)
	s.acceptCh = make(chan struct{})
	bound = true
	s.log.Debug("prefill session", zap.String("prefill", m.Prefill), zap.String("peer", peer), zap.String("node", sender.Address))
	offer := &wire.Offer{Version: ProtocolVersion, Session: ss.token, PeerId: s.cfg.ID, WorkerAddress: s.tr.Address()}
	for i, r := range s.regions {
		d := r.Desc()
		offer.Regions = append(offer.Regions, &wire.Region{Addr: d.Addr, Len: d.Len, Key: d.Key, ItemLen: s.bufs[i].ItemLen})
	}
	return offer, ss
}

// matchLayout checks a prefill layout against the pool, buffer by buffer.
func matchLayout(pool []Buffer, layout []PrefillBuffer) error {
	if len(layout) != len(pool) {
		return errors.Newf("%d prefill buffers, the decode pool has %d", len(layout), len(pool))
	}
	for i, b := range layout {
		if b.ItemLen != pool[i].ItemLen {
			return errors.Newf("prefill buffer %d (%s): item length %d, decode buffer %d (%s): %d", i, b.Name, b.ItemLen, i, pool[i].Name, pool[i].ItemLen)
		}
	}
	return nil
}

// session finds the sender's live session, or says why not: the token
// must name a session of the sender's node and of its certificate's name.
func (s *Server) session(sender *actor.PID, peer, token string) (*Session, string) {
	ss := s.sessions[token]
	switch {
	case ss == nil:
		return nil, "no such session"
	case sender == nil || sender.Address != ss.addr:
		return nil, "not the session's node"
	case peer != ss.peer:
		return nil, "not the session's peer"
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.bye || ss.finished {
		return nil, "the session ended"
	}
	return ss, ""
}

// refuseNotice answers a notice that changes nothing, and logs it. Called
// with s.mu held; it unlocks it.
func (s *Server) refuseNotice(ss *Session, m *wire.ChunkNotice, code wire.Code, err error) *wire.NoticeAck {
	s.mu.Unlock()
	s.refused(ss, m, err)
	return ack(code, "%v", err)
}

// admit adds chunk c to room r, unless its notice was malformed (err) or
// names pages the room does not own: then the prefill may have written
// where it should not, so the room fails and must not be decoded. Called
// with s.mu held; it unlocks it. It returns nil when c was admitted.
func (s *Server) admit(ss *Session, m *wire.ChunkNotice, r *room, c Chunk, err error) *wire.NoticeAck {
	if err == nil {
		err = s.inRoom(r, c)
	}
	if err != nil {
		r.fail(errors.Mark(errors.Mark(err, ErrBadInput), ErrChunkFailed))
		return s.refuseNotice(ss, m, wire.Code_BAD_INPUT, err)
	}
	r.Chunks = append(r.Chunks, c)
	s.mu.Unlock()
	return nil
}

func ack(code wire.Code, format string, args ...any) *wire.NoticeAck {
	return &wire.NoticeAck{Code: code, Error: fmt.Sprintf(format, args...)}
}

var statuses = map[wire.Status]system.Status{
	wire.Status_SUCCEEDED: system.Succeeded, wire.Status_FAILED: system.Failed, wire.Status_DROPPED: system.Dropped,
}

func (s *Server) notice(sender *actor.PID, peer string, m *wire.ChunkNotice) *wire.NoticeAck {
	s.mu.Lock()
	ss, why := s.session(sender, peer, m.Session)
	if ss == nil {
		s.mu.Unlock()
		return ack(wire.Code_REFUSED, "room %d notice: %s", m.Room, why)
	}
	ss.mu.Lock()
	ss.notices++
	ss.mu.Unlock()
	if s.cfg.Group != nil {
		return s.groupNotice(ss, m)
	}
	c, err := s.check(m)
	r := s.rooms[m.Room]
	switch {
	case err != nil && (r == nil || r.session != ss && r.session != nil):
		// Nothing of the room is this session's to change.
		return s.refuseNotice(ss, m, wire.Code_BAD_INPUT, err)
	case r == nil && !s.cfg.AcceptUnknownRooms:
		err := errors.Newf("room %d is unknown to the decode server (not Expected)", m.Room)
		return s.refuseNotice(ss, m, wire.Code_BAD_INPUT, err)
	case r == nil:
		r = &room{Room: Room{ID: m.Room}, done: make(chan struct{})}
		s.rooms[m.Room] = r
		s.watchRoom(r)
	case r.session != nil && r.session != ss:
		err := errors.Newf("room %d is reported by another prefill session (%s)", m.Room, r.session.prefill)
		return s.refuseNotice(ss, m, wire.Code_REFUSED, err)
	case r.terminal():
		err := errors.Newf("room %d chunk [%d, %d): the room already ended (complete: %v)", m.Room, m.Start, m.End, r.Complete)
		return s.refuseNotice(ss, m, wire.Code_BAD_INPUT, err)
	}
	r.session = ss
	if refused := s.admit(ss, m, r, c, err); refused != nil {
		return refused
	}

	if c.Status != system.Succeeded {
		err := errors.Mark(errors.Newf("room %d chunk [%d, %d): %s on the prefill: %s", c.Room, c.Start, c.End, c.Status, c.Err), ErrChunkFailed)
		if c.NotQuiesced {
			err = errors.Mark(err, ErrNotQuiesced)
		}
		s.finishChunk(ss, r, err)
		return &wire.NoticeAck{}
	}
	if s.cfg.Verify != nil {
		if verr := s.cfg.Verify(ss, c); verr != nil {
			err := errors.Mark(errors.Wrapf(verr, "room %d chunk [%d, %d): verify", c.Room, c.Start, c.End), ErrChunkFailed)
			s.finishChunk(ss, r, err)
			return ack(wire.Code_ROOM_FAILED, "%v", err)
		}
	}
	s.finishChunk(ss, r, nil)
	return &wire.NoticeAck{}
}

// check turns a notice into a Chunk, checking what needs no room: status,
// range, page lists against the pool.
func (s *Server) check(m *wire.ChunkNotice) (Chunk, error) {
	st, ok := statuses[m.Status]
	switch {
	case !ok:
		return Chunk{}, errors.Newf("room %d notice: status %d unknown", m.Room, m.Status)
	case m.Start < 0 || m.End < m.Start:
		return Chunk{}, errors.Newf("room %d notice: chunk [%d, %d) is not a range", m.Room, m.Start, m.End)
	case len(m.Positions) != len(m.DstPages):
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): %d positions, %d pages", m.Room, m.Start, m.End, len(m.Positions), len(m.DstPages))
	case len(m.DstPages) > s.pages:
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): %d pages, the pool has %d", m.Room, m.Start, m.End, len(m.DstPages), s.pages)
	}
	c := Chunk{Room: m.Room, Start: int(m.Start), End: int(m.End), Last: m.Last, Status: st, Err: m.Error,
		NotQuiesced: m.NotQuiesced, Bytes: m.Bytes, Positions: make([]int, len(m.Positions)), DstPages: make([]int, len(m.DstPages))}
	for i, p := range m.DstPages {
		if p < 0 || p >= int64(s.pages) {
			return Chunk{}, errors.Newf("room %d chunk [%d, %d): decode page %d at index %d is outside the pool of %d pages", m.Room, m.Start, m.End, p, i, s.pages)
		}
		// A request has one distinct decode page per position, so its
		// positions are below the pool's page count.
		if m.Positions[i] < 0 || m.Positions[i] >= int64(s.pages) {
			return Chunk{}, errors.Newf("room %d chunk [%d, %d): position %d at index %d is outside the pool's %d pages", m.Room, m.Start, m.End, m.Positions[i], i, s.pages)
		}
		c.Positions[i], c.DstPages[i] = int(m.Positions[i]), int(p)
	}
	return c, nil
}

// inRoom checks a chunk's pages against the room's Expected pages.
func (s *Server) inRoom(r *room, c Chunk) error {
	if r.Pages == nil {
		return nil
	}
	for i, pos := range c.Positions {
		switch {
		case pos >= len(r.Pages):
			return errors.Newf("room %d chunk [%d, %d): position %d is beyond the room's %d pages", c.Room, c.Start, c.End, pos, len(r.Pages))
		case r.Pages[pos] != c.DstPages[i]:
			return errors.Newf("room %d chunk [%d, %d): position %d went to decode page %d, the room's page is %d", c.Room, c.Start, c.End, pos, c.DstPages[i], r.Pages[pos])
		}
	}
	return nil
}

// finishChunk records a chunk's outcome in its room and session.
func (s *Server) finishChunk(ss *Session, r *room, err error) {
	s.mu.Lock()
	c := r.Chunks[len(r.Chunks)-1]
	complete := false
	switch {
	case err != nil:
		r.fail(err)
	case c.Last && !r.terminal():
		r.Complete, complete = true, true
		close(r.done)
	}
	s.mu.Unlock()
	ss.mu.Lock()
	ss.report.Chunks++
	if err != nil {
		ss.report.Failed++
		if ss.err == nil {
			ss.err = err
		}
	}
	if complete {
		ss.report.Rooms++
	}
	ss.mu.Unlock()
	if err != nil {
		s.log.Warn("room failed", zap.Uint64("room", c.Room), zap.Int("start", c.Start), zap.Int("end", c.End), zap.Error(err))
	} else {
		s.log.Debug("chunk landed", zap.Uint64("room", c.Room), zap.Int("start", c.Start), zap.Int("end", c.End), zap.Bool("complete", complete))
	}
}

// refused counts a notice the server did not accept against its session.
func (s *Server) refused(ss *Session, m *wire.ChunkNotice, err error) {
	s.log.Warn("chunk notice refused", zap.String("prefill", ss.prefill), zap.Uint64("room", m.Room),
		zap.Int64("start", m.Start), zap.Int64("end", m.End), zap.Error(err))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.report.Failed++
	if ss.err == nil {
		ss.err = errors.Mark(err, ErrChunkFailed)
	}
}

func (s *Server) bye(sender *actor.PID, peer string, m *wire.Bye) *wire.Summary {
	s.mu.Lock()
	ss, why := s.session(sender, peer, m.Session)
	if ss == nil {
		s.mu.Unlock()
		return &wire.Summary{Code: wire.Code_REFUSED, Error: "bye: " + why}
	}
	var incomplete []uint64
	for id, r := range s.rooms {
		if r.session == ss && !r.terminal() {
			incomplete = append(incomplete, id)
		}
	}
	if s.cfg.Group != nil {
		incomplete = s.groupBye(ss, m.Aborted != "")
	}
	slices.Sort(incomplete)
	ss.mu.Lock()
	ss.bye = true
	var cause error
	switch {
	case m.Aborted != "":
		cause = errors.Newf("the prefill stopped early: %s", m.Aborted)
	case m.Chunks != uint64(ss.notices):
		cause = errors.Newf("the prefill sent %d chunk notices, %d arrived", m.Chunks, ss.notices)
	case len(incomplete) > 0:
		cause = errors.Newf("rooms %v never received their last chunk", incomplete)
	}
	if cause != nil {
		cause = errors.Mark(cause, ErrSessionAborted)
		if ss.err == nil {
			ss.err = cause
		}
	}
	sum := &wire.Summary{Chunks: uint64(ss.report.Chunks), Failed: uint64(ss.report.Failed)}
	if ss.err != nil {
		sum.Code, sum.Error = wire.Code_ROOM_FAILED, ss.err.Error()
	}
	ss.mu.Unlock()
	for _, id := range incomplete {
		s.rooms[id].fail(errors.Mark(errors.Newf("room %d: the prefill %s ended its session before the room's last chunk", id, ss.prefill), ErrSessionAborted))
	}
	s.mu.Unlock()
	if cause != nil {
		s.log.Warn("prefill session not complete", zap.String("prefill", ss.prefill), zap.Error(cause))
	}
	// The answer is still queued in the endpoint writer: a caller that
	// stops the node when the session ends would drop it. The session ends
	// when the prefill, having read it, leaves (left), or after the grace.
	time.AfterFunc(s.cfg.ByeGrace, func() { s.forget(ss); ss.end(nil) })
	return sum
}

// forget removes an ended session from the server's maps; mu is held.
func (s *Server) forgetLocked(ss *Session) {
	if s.sessions[ss.token] != ss {
		return
	}
	delete(s.watched, ss.watch)
	delete(s.sessions, ss.token)
	s.node.unbind(ss.peer)
	if hb := ss.heartbeat; hb != nil {
		ss.heartbeat = nil
		// Not here: this may run on the server's actor, and on the
		// monitor's own goroutine when it reported the loss.
		go hb.stop()
	}
}

// forget removes an ended session from the server's maps.
func (s *Server) forget(ss *Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(ss)
}

// left handles the end of a watched prefill session actor (who), or the
// loss of its node's heartbeats (hb).
func (s *Server) left(who *actor.PID, hb *heartbeatLost) {
	s.mu.Lock()
	ss := s.watched[who.String()]
	if hb != nil {
		ss = hb.session
	}
	if ss == nil || s.sessions[ss.token] != ss {
		s.mu.Unlock()
		return
	}
	s.forgetLocked(ss)
	ss.mu.Lock()
	bye := ss.bye
	ss.mu.Unlock()
	var lost error
	if !bye {
		lost = errors.Newf("prefill %s (%s) went away without Bye", ss.prefill, ss.watch)
		if hb != nil {
			lost = errors.Wrapf(hb.err, "prefill %s (%s)", ss.prefill, ss.addr)
		}
		lost = errors.Mark(errors.Mark(lost, ErrPrefillLost), ErrNotQuiesced)
		for _, r := range s.rooms {
			if r.session == ss {
				r.fail(errors.Mark(errors.Mark(errors.Wrapf(lost, "room %d", r.ID), ErrPrefillLost), ErrNotQuiesced))
			}
		}
		if s.cfg.Group != nil {
			s.groupLost(ss, who, lost)
		}
	}
	s.mu.Unlock()
	if lost != nil {
		s.log.Warn("prefill lost", zap.String("prefill", ss.prefill), zap.String("node", ss.addr), zap.Error(lost))
	}
	ss.end(lost)
}
