package core

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/messages/wire"
)

// Rules is what the decode core knows of a Server's Config.
type Rules struct {
	MaxSessions        int
	MaxRoomsPerSession int
	// Prefills, when set, are the identities that may open a session.
	Prefills []string
	// TLS: identities are verified certificate names (else each Hello
	// claims its own name: development on loopback).
	TLS bool
	// Group: the sessions are a CP group's ranks; nil: every session is a
	// group of one.
	Group *Group
	// PageSize, when set, is the pool's; 0: the first session's, kept while
	// any session or room holds the pool.
	PageSize    int
	RoomTimeout time.Duration
	ByeGrace    time.Duration
	// AcceptUnknownRooms: a notice for a room nobody Expected creates it.
	AcceptUnknownRooms bool
	// Admit, Verify: Config.Admit, Config.Verify are set.
	Admit, Verify bool
	// Size: the pool is sized by a Hello (Config.Size) and released when
	// no session and no room holds it.
	Size         bool
	MaxPoolBytes uint64
}

// Core is the decode side's state machine: sessions, rooms and the pages
// they hold. It takes Msgs and returns Effects; it does no I/O, takes no
// lock and reads no clock, so that every rule is a table of messages and
// effects (testdata/*.txt). The Server's actor is its only caller.
//
// Its rules, in short (docs/SECURITY.md has the table):
//
//   - a Hello is refused, with a code and a reason, for its version, its
//     shape, the server's state (closed, draining, at MaxSessions), its
//     identity (not in Prefills, or already holding a live session), its
//     geometry or Admit; nothing is sized for a refused Hello;
//   - a room is reported only by sessions of one identity: the one Expect
//     named, or the first that reports it; a session holds at most
//     MaxRoomsPerSession rooms not yet ended;
//   - a room completes when its chunks tile the request to its last one,
//     each reported successful by exactly the ranks owning its pages (a
//     group of one: the session), and Verify accepted them;
//   - a loss is declared on evidence (the heartbeats), never on a
//     Terminated; a lost session's access is revoked before its rooms'
//     failure is published, and the failure says whether the pages are
//     quiet;
//   - no page is handed to another room while a peer may still write it:
//     pages of a room whose writer may still write are held until that
//     writer's access is revoked, and kept out for good when the revocation
//     could not be confirmed;
//   - an empty session completes nothing and leaves nothing behind.
type Core struct {
	r        Rules
	pool     []Buffer // nil until sized
	pages    int      // the smallest buffer's capacity
	pageSize int

	sessions   map[string]*csession // by token, until their end was reported
	identities map[string]*csession // open or said goodbye, by identity (and rank)
	actors     map[string]*csession // by watched session actor
	rooms      map[uint64]*croom    // not released
	lingering  map[*croom]bool      // released, pages not yet quiet
	owner      map[int]*croom       // page -> the room holding it
	quarantine map[int]bool         // pages kept out for good
	timers     map[uint64]timer
	nextTimer  uint64
	pending    *pending
	draining   bool
	closed     bool
	// lostRanks are a group's ranks whose last session was lost, until one
	// of theirs says Hello again: a room that needs one fails at once.
	lostRanks map[int]error
	// tainted: a session's access could not be confirmed revoked. It holds
	// the pool's keys, so the pool is never released again.
	tainted bool

	out []Effect
}

type sessionState int

const (
	sessionOpen sessionState = iota
	// sessionBye: said goodbye. Its access is revoked first, and its
	// answer sent once that is confirmed; it ends when its actor leaves or
	// after ByeGrace, so that a node stopping right after does not tear
	// the answer down.
	sessionBye
	sessionEnding // ends once its access is revoked
)

// csession is one session's state.
type csession struct {
	SessionInfo
	key     string // identity, and rank in a group
	state   sessionState
	notices int // notices it sent, accepted or not, as the prefill counts them
	report  SessionReport
	err     error // why it is not complete
	lost    error
	said    bool // said goodbye without stopping early
	// revoking: its Revoke went out; revoked: the RevokedMsg came back.
	revoking, revoked bool
	// bye is the Bye's answer, held until the access is revoked: the
	// prefill learns its verdict only once nothing it posts can land.
	bye   *AnswerBye
	rooms map[*croom]bool
	// ended are the ids of rooms it reported in that ended and were
	// forgotten (nobody Expected them), oldest first, at most
	// MaxRoomsPerSession: a later notice of one is the prefill's mistake,
	// not a new room (which its last chunk alone could complete).
	ended []uint64
}

// croom is one room's state.
type croom struct {
	id        uint64
	expected  bool
	pages     []int       // Expected pages; nil when learned from notices
	learned   map[int]int // position -> page, for a room nobody Expected
	held      []int       // pages it holds in Core.owner
	from      string      // the identity Expect named, or ""
	ident     string      // the identity that reports it, once one did
	group     *GroupRoom  // from its first report (the page size is the session's)
	reporters map[*csession]bool
	chunks    []Chunk
	complete  bool
	err       error // its published failure
	// pendingErr is a failure decided while some lost sessions' access is
	// still being revoked (awaiting): published once they answered, marked
	// ErrNotQuiesced unless every revocation was confirmed.
	pendingErr error
	awaiting   map[*csession]bool
	// dirty are the sessions that may still write its pages; poisoned: one
	// of them could not be confirmed revoked.
	dirty    map[*csession]bool
	poisoned bool
	released bool
	timer    uint64
}

type timerKind int

const (
	roomTimer timerKind = iota
	byeTimer
)

type timer struct {
	kind    timerKind
	room    *croom
	session *csession
}

// pending is a Hello or a notice waiting on a Call's result.
type pending struct {
	hello    *HelloMsg
	layout   []PrefillBuffer
	rank     int
	key      string
	ident    string
	pageSize int
	sized    bool // this Hello sized the pool

	session *csession
	room    *croom
	chunk   Chunk
}

// NewCore returns a core; pool is the Server's pool when Config.Buffers
// gave one (checked by the caller), nil when a Hello sizes it.
func NewCore(r Rules, pool []Buffer) *Core {
	c := &Core{r: r, pageSize: r.PageSize, sessions: map[string]*csession{}, identities: map[string]*csession{},
		actors: map[string]*csession{}, rooms: map[uint64]*croom{}, lingering: map[*croom]bool{}, owner: map[int]*croom{},
		quarantine: map[int]bool{}, timers: map[uint64]timer{}, lostRanks: map[int]error{}}
	if pool != nil {
		c.setPool(pool)
	}
	return c
}

func (c *Core) setPool(bufs []Buffer) {
	c.pool = slices.Clone(bufs)
	c.pages = 0
	for i, b := range bufs {
		if i == 0 || b.Pages < c.pages {
			c.pages = b.Pages
		}
	}
}

// Step handles one message and returns the effects, in the order the shell
// must perform them.
func (c *Core) Step(m Msg) []Effect {
	c.out = nil
	switch m := m.(type) {
	case HelloMsg:
		c.hello(m)
	case AdmittedMsg:
		c.admitted(m)
	case SizedMsg:
		c.sized(m)
	case AccessMsg:
		c.accessed(m)
	case NoticeMsg:
		c.notice(m)
	case VerifiedMsg:
		c.verified(m)
	case ByeMsg:
		c.bye(m)
	case DepartedMsg:
		c.departed(m)
	case PeerLostMsg:
		c.peerLost(m)
	case RevokedMsg:
		c.revoked(m)
	case TimerMsg:
		c.timerFired(m)
	case ExpectMsg:
		c.expect(m)
	case ReleaseMsg:
		c.release(m)
	case LookupMsg:
		c.lookup(m)
	case DisconnectMsg:
		c.disconnect(m)
	case DrainMsg:
		c.draining = true
		c.emit(Reply{Drained: len(c.sessions) == 0})
		c.maybeDrained()
	case CloseMsg:
		c.close()
	case StateMsg:
		c.emit(Reply{State: c.state()})
	default:
		c.warn("decode core: unknown message", "type", fmt.Sprintf("%T", m))
	}
	out := c.out
	c.out = nil
	return out
}

func (c *Core) emit(e ...Effect) { c.out = append(c.out, e...) }

func (c *Core) warn(msg string, kv ...any)  { c.emit(Log{Level: Warn, Msg: msg, Fields: kv}) }
func (c *Core) debug(msg string, kv ...any) { c.emit(Log{Level: Debug, Msg: msg, Fields: kv}) }

func (c *Core) state() State {
	open := 0
	for _, s := range c.sessions {
		if s.state != sessionEnding {
			open++
		}
	}
	return State{Sessions: open, Rooms: len(c.rooms), Pooled: c.pool != nil, Draining: c.draining, Closed: c.closed,
		Quarantined: len(c.quarantine), Tainted: c.tainted}
}

// --- Hello ---

// ProtocolVersion is the control protocol version this package speaks
// (messages/wire: Hello.version, Offer.version).
const ProtocolVersion = uint32(wire.Version_VERSION_CURRENT)

// Bounds on a Hello's fields, which are logged and kept for the session.
const (
	// MaxNameLen bounds a name a peer sends: the prefill's, its session
	// actor's, a buffer's, the decode's peer id.
	MaxNameLen      = 256
	maxMetadata     = 64
	maxMetadataText = 4096
	// MaxPageSize bounds Hello.page_size: tokens per page.
	MaxPageSize = 1 << 20
	// MaxBuffers bounds a Hello's layout before anything is sized by it.
	MaxBuffers = 1 << 16
)

func (c *Core) refuseHello(code wire.Code, reason string, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	// Logged before it is answered: whoever reads the answer finds the log.
	c.warn("hello refused", "reason", reason, "error", text)
	c.emit(AnswerHello{Code: code, Reason: reason, Text: text})
}

func (c *Core) hello(m HelloMsg) {
	h := m.Hello
	switch {
	case h == nil:
		c.refuseHello(wire.Code_BAD_INPUT, "bad_input", "hello: empty")
		return
	case c.pending != nil:
		c.refuseHello(wire.Code_UNAVAILABLE, "busy", "hello: another Hello is being answered")
		return
	}
	name := h.Prefill
	if len(name) > MaxNameLen {
		name = name[:MaxNameLen]
	}
	switch {
	case h.Version != ProtocolVersion:
		c.refuseHello(wire.Code_VERSION, "version", "hello from %q: protocol version %d, this decode server speaks %d", name, h.Version, ProtocolVersion)
		return
	case m.From.Node == "" || h.SessionId == "" || h.SessionAddress != m.From.Node:
		c.refuseHello(wire.Code_REFUSED, "bad_input", "hello from %q: its session actor %.256s/%.256s is not on the sender's node", name, h.SessionAddress, h.SessionId)
		return
	case c.r.TLS && m.From.Peer == "":
		c.refuseHello(wire.Code_REFUSED, "identity", "hello from %q: the peer has no verified name", name)
		return
	}
	if err := checkHello(h); err != nil {
		c.refuseHello(wire.Code_BAD_INPUT, "bad_input", "hello from %q: %v", name, err)
		return
	}
	switch {
	case c.closed:
		c.refuseHello(wire.Code_UNAVAILABLE, "closed", "hello from %q: the decode server is closed", name)
		return
	case c.draining:
		c.refuseHello(wire.Code_UNAVAILABLE, "draining", "hello from %q: the decode server is draining (stopping): it takes no new session", name)
		return
	case c.state().Sessions >= c.r.MaxSessions:
		c.refuseHello(wire.Code_UNAVAILABLE, "limit", "hello from %q: already %d sessions (Config.MaxSessions)", name, c.r.MaxSessions)
		return
	}
	ident := m.From.Peer
	if !c.r.TLS {
		ident = h.Prefill
	}
	if len(c.r.Prefills) > 0 && !slices.Contains(c.r.Prefills, m.From.Peer) {
		c.refuseHello(wire.Code_REFUSED, "identity", "hello from %q: peer %q is not a prefill this decode server serves", name, m.From.Peer)
		return
	}
	rank, key := 0, ident
	if g := c.r.Group; g != nil {
		text, ok := h.Metadata[RankKey]
		r, err := strconv.Atoi(text)
		if !ok || err != nil || r < 0 || r >= g.Size {
			c.refuseHello(wire.Code_BAD_INPUT, "bad_input", "hello from %q: metadata %s = %.32q: this decode server serves a CP group of %d ranks, want a rank in [0, %d)",
				name, RankKey, text, g.Size, g.Size)
			return
		}
		// A group has one session per rank, whoever holds it.
		rank, key = r, "rank "+strconv.Itoa(r)
	}
	if s := c.identities[key]; s != nil {
		who := fmt.Sprintf("prefill %q", ident)
		if c.r.Group != nil {
			who = fmt.Sprintf("CP rank %d (prefill %q)", rank, s.Identity)
		}
		c.refuseHello(wire.Code_UNAVAILABLE, "identity_busy", "hello from %q: %s already has a live session from %s; a second one is refused until it ends",
			name, who, s.Node)
		return
	}
	actor := h.SessionAddress + "/" + h.SessionId
	if c.actors[actor] != nil {
		c.refuseHello(wire.Code_REFUSED, "bad_input", "hello from %q: its session actor %s already has a session", name, actor)
		return
	}
	pageSize := int(h.PageSize)
	switch {
	case pageSize < 1 || pageSize > MaxPageSize:
		c.refuseHello(wire.Code_BAD_INPUT, "geometry", "hello from %q: page size %d tokens (want 1 to %d)", name, h.PageSize, MaxPageSize)
		return
	case c.r.Group != nil && pageSize != c.r.Group.PageSize:
		c.refuseHello(wire.Code_BAD_INPUT, "geometry", "hello from %q: page size %d tokens, the CP group's is %d (Group.PageSize)", name, pageSize, c.r.Group.PageSize)
		return
	case c.pageSize != 0 && pageSize != c.pageSize:
		c.refuseHello(wire.Code_BAD_INPUT, "geometry", "hello from %q: page size %d tokens, the decode pool's is %d", name, pageSize, c.pageSize)
		return
	}
	layout := make([]PrefillBuffer, len(h.Buffers))
	for i, b := range h.Buffers {
		layout[i] = PrefillBuffer{Name: b.Name, Layer: int(b.Layer), ItemLen: b.ItemLen, Pages: b.Pages}
	}
	c.pending = &pending{hello: &m, layout: layout, rank: rank, key: key, ident: ident, pageSize: pageSize}
	if c.r.Admit {
		c.emit(CallAdmit{Prefill: h.Prefill, Metadata: maps.Clone(h.Metadata)})
		return
	}
	c.admitted(AdmittedMsg{})
}

func rankText(g *Group, rank int) string {
	if g == nil {
		return ""
	}
	return " rank " + strconv.Itoa(rank)
}

// checkHello checks what of a Hello needs no pool: names, metadata, the
// buffers' count and item lengths.
func checkHello(m *wire.Hello) error {
	if len(m.Prefill) > MaxNameLen || len(m.SessionId) > MaxNameLen || len(m.SessionAddress) > MaxNameLen {
		return errors.Newf("prefill name, session id or address longer than %d bytes", MaxNameLen)
	}
	if len(m.Metadata) > maxMetadata {
		return errors.Newf("%d metadata entries: at most %d", len(m.Metadata), maxMetadata)
	}
	for k, v := range m.Metadata {
		if len(k)+len(v) > maxMetadataText {
			return errors.Newf("metadata entry %.32q: more than %d bytes", k, maxMetadataText)
		}
	}
	if len(m.Buffers) == 0 || len(m.Buffers) > MaxBuffers {
		return errors.Newf("%d buffers (want 1 to %d)", len(m.Buffers), MaxBuffers)
	}
	for i, b := range m.Buffers {
		switch {
		case b == nil:
			return errors.Newf("buffer %d: missing", i)
		case len(b.Name) > MaxNameLen:
			return errors.Newf("buffer %d: name longer than %d bytes", i, MaxNameLen)
		case b.ItemLen == 0:
			return errors.Newf("buffer %d (%.64s): zero item length", i, b.Name)
		}
	}
	return nil
}

// takeHello returns the Hello waiting on a Call, if any.
func (c *Core) takeHello(what string) *pending {
	p := c.pending
	if p == nil || p.hello == nil {
		c.warn("decode core: a result with no Hello waiting", "result", what)
		return nil
	}
	return p
}

// failHello refuses the pending Hello; a pool it sized is released again.
func (c *Core) failHello(code wire.Code, reason string, format string, args ...any) {
	c.pending = nil
	c.refuseHello(code, reason, format, args...)
	c.maybeReleasePool()
}

func (c *Core) admitted(m AdmittedMsg) {
	p := c.takeHello("admitted")
	if p == nil {
		return
	}
	name := p.hello.Hello.Prefill
	if m.Err != nil {
		c.failHello(wire.Code_BAD_INPUT, "admit", "hello from %q: %v", name, m.Err)
		return
	}
	if c.pool != nil {
		c.matched(p)
		return
	}
	if !c.r.Size {
		c.failHello(wire.Code_UNAVAILABLE, "geometry", "hello from %q: the decode pool is not registered", name)
		return
	}
	if err := layoutBytes(p.layout, c.r.MaxPoolBytes); err != nil {
		c.failHello(wire.Code_BAD_INPUT, "geometry", "hello from %q: sizing the decode pool: %v", name, err)
		return
	}
	c.emit(CallSize{Layout: slices.Clone(p.layout)})
}

func (c *Core) sized(m SizedMsg) {
	p := c.takeHello("sized")
	if p == nil {
		return
	}
	name := p.hello.Hello.Prefill
	if m.Err == nil {
		m.Err = CheckPool(m.Buffers)
	}
	if m.Err != nil {
		c.failHello(wire.Code_BAD_INPUT, "geometry", "hello from %q: sizing the decode pool: %v", name, m.Err)
		return
	}
	c.setPool(m.Buffers)
	p.sized = true
	c.matched(p)
}

// matched checks the Hello's layout against the pool, then asks for the
// session's access point.
func (c *Core) matched(p *pending) {
	name := p.hello.Hello.Prefill
	if err := MatchLayout(c.pool, p.layout); err != nil {
		c.failHello(wire.Code_BAD_INPUT, "geometry", "hello from %q: %v", name, err)
		return
	}
	c.emit(CallOpenAccess{Session: p.hello.Token})
}

func (c *Core) accessed(m AccessMsg) {
	p := c.takeHello("access")
	if p == nil {
		return
	}
	h := p.hello.Hello
	if m.Err != nil {
		c.failHello(wire.Code_UNAVAILABLE, "transport", "hello from %q: opening an access point to the decode pool: %v", h.Prefill, m.Err)
		return
	}
	c.pending = nil
	s := &csession{SessionInfo: SessionInfo{Token: p.hello.Token, Prefill: h.Prefill, Identity: p.ident, Node: p.hello.From.Node,
		Actor: h.SessionAddress + "/" + h.SessionId, Rank: p.rank, PageSize: p.pageSize, Metadata: maps.Clone(h.Metadata)},
		key: p.key, rooms: map[*croom]bool{}}
	s.report.Prefill = h.Prefill
	c.sessions[s.Token] = s
	c.identities[s.key] = s
	c.actors[s.Actor] = s
	c.pageSize = p.pageSize
	delete(c.lostRanks, s.Rank) // back: new rooms may count on it again
	c.emit(SessionOpened{Session: s.SessionInfo}, AnswerHello{Code: wire.Code_OK, Session: s.Token, Address: slices.Clone(m.Address)})
	c.debug("prefill session", "prefill", h.Prefill, "identity", p.ident, "node", s.Node, "actor", s.Actor, "rank", s.Rank, "revocable", m.Revocable)
}

// layoutBytes checks that a pool of the layout's geometry stays within
// limit (products and sums checked for overflow).
func layoutBytes(layout []PrefillBuffer, limit uint64) error {
	var total uint64
	for i, b := range layout {
		switch {
		case b.Pages == 0:
			return errors.Newf("buffer %d (%.64s): zero pages", i, b.Name)
		case b.ItemLen > limit/b.Pages:
			return errors.Newf("buffer %d (%.64s): %d pages of %d bytes: more than the pool's bound of %d bytes (Config.MaxPoolBytes)", i, b.Name, b.Pages, b.ItemLen, limit)
		case b.ItemLen*b.Pages > limit-total:
			return errors.Newf("%d buffers: more than the pool's bound of %d bytes (Config.MaxPoolBytes)", len(layout), limit)
		}
		total += b.ItemLen * b.Pages
	}
	return nil
}

// CheckPool checks a pool's geometry (addresses are the shell's).
func CheckPool(bufs []Buffer) error {
	if len(bufs) == 0 || len(bufs) > MaxBuffers {
		return errors.Newf("decode pool of %d buffers: want 1 to %d", len(bufs), MaxBuffers)
	}
	for i, b := range bufs {
		switch {
		case b.ItemLen == 0:
			return errors.Newf("decode buffer %d (%s): zero item length", i, b.Name)
		case b.Pages < 1:
			return errors.Newf("decode buffer %d (%s): %d pages", i, b.Name, b.Pages)
		case b.ItemLen > (1<<63)/uint64(b.Pages):
			return errors.Newf("decode buffer %d (%s): %d pages of %d bytes overflow", i, b.Name, b.Pages, b.ItemLen)
		}
	}
	return nil
}

// MatchLayout checks a prefill layout against the pool, buffer by buffer.
func MatchLayout(pool []Buffer, layout []PrefillBuffer) error {
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

// --- sessions: who may speak ---

// sessionFor finds the sender's open session, or says why not: the token
// must name a session of the sender's node and of its verified name.
func (c *Core) sessionFor(from Origin, token string) (*csession, string) {
	s := c.sessions[token]
	switch {
	case s == nil:
		return nil, "no such session"
	case from.Node != s.Node:
		return nil, "not the session's node"
	case c.r.TLS && from.Peer != s.Identity:
		return nil, "not the session's peer"
	case s.state != sessionOpen:
		return nil, "the session ended"
	}
	return s, ""
}

// --- notices ---

var statuses = map[wire.Status]messages.Status{
	wire.Status_SUCCEEDED: messages.Succeeded, wire.Status_FAILED: messages.Failed, wire.Status_DROPPED: messages.Dropped,
}

// refuseNotice answers a notice that changes no room, and counts it
// against its session.
func (c *Core) refuseNotice(s *csession, n *wire.ChunkNotice, code wire.Code, reason string, err error) {
	c.warn("chunk notice refused", "prefill", s.Prefill, "room", n.Room, "start", n.Start, "end", n.End, "reason", reason, "error", err.Error())
	c.emit(AnswerNotice{Code: code, Reason: reason, Text: err.Error()})
	s.report.Failed++
	if s.err == nil {
		s.err = errors.Mark(err, ErrChunkFailed)
	}
}

func (c *Core) notice(m NoticeMsg) {
	n := m.Notice
	if n == nil {
		c.emit(AnswerNotice{Code: wire.Code_BAD_INPUT, Reason: "bad_input", Text: "notice: empty"})
		return
	}
	s, why := c.sessionFor(m.From, n.Session)
	if s == nil {
		c.warn("chunk notice refused", "node", m.From.Node, "room", n.Room, "reason", "not_session", "error", why)
		c.emit(AnswerNotice{Code: wire.Code_REFUSED, Reason: "not_session", Text: fmt.Sprintf("room %d notice: %s", n.Room, why)})
		return
	}
	s.notices++
	ch, err := c.checkNotice(s, n)
	r := c.rooms[n.Room]
	if r == nil {
		if c.lateNotice(s, n, ch, err) {
			return
		}
		if slices.Contains(s.ended, n.Room) {
			c.refuseNotice(s, n, wire.Code_BAD_INPUT, "room_ended", errors.Newf("room %d chunk [%d, %d): the room already ended", n.Room, n.Start, n.End))
			return
		}
		if err != nil {
			c.refuseNotice(s, n, wire.Code_BAD_INPUT, "bad_input", err)
			return
		}
		if !c.r.AcceptUnknownRooms {
			c.refuseNotice(s, n, wire.Code_BAD_INPUT, "unknown_room", errors.Newf("room %d is unknown to the decode server (not Expected)", n.Room))
			return
		}
	}
	switch {
	case r != nil && r.from != "" && r.from != s.Identity:
		c.refuseNotice(s, n, wire.Code_REFUSED, "not_owner", errors.Newf("room %d is expected from prefill %q, not %q", n.Room, r.from, s.Identity))
		return
	case r != nil && c.r.Group == nil && r.ident != "" && r.ident != s.Identity:
		c.refuseNotice(s, n, wire.Code_REFUSED, "not_owner", errors.Newf("room %d is reported by prefill %q, not %q", n.Room, r.ident, s.Identity))
		return
	case r != nil && c.r.Group == nil && len(r.reporters) > 0 && !r.reporters[s]:
		c.refuseNotice(s, n, wire.Code_REFUSED, "not_owner", errors.Newf("room %d is reported by another session of prefill %q", n.Room, s.Identity))
		return
	case r != nil && r.ended():
		c.refuseNotice(s, n, wire.Code_BAD_INPUT, "room_ended", errors.Newf("room %d chunk [%d, %d): the room already ended (complete: %v)", n.Room, n.Start, n.End, r.complete))
		return
	case (r == nil || !r.reporters[s]) && c.openRooms(s) >= c.r.MaxRoomsPerSession:
		c.refuseNotice(s, n, wire.Code_REFUSED, "room_limit", errors.Newf("room %d: the session already holds %d rooms not ended (Config.MaxRoomsPerSession)", n.Room, c.r.MaxRoomsPerSession))
		return
	}
	if r == nil {
		r = c.newRoom(n.Room, nil, "")
	}
	r.reporters[s] = true
	r.ident = s.Identity
	s.rooms[r] = true
	if err == nil {
		err = c.claim(r, ch)
	}
	if err != nil {
		// The prefill may have written where it should not: the room must
		// not be decoded, and its pages are quiet only once it is cut off.
		r.dirty[s] = true
		c.failRoom(r, errors.Mark(errors.Mark(errors.Mark(err, ErrBadInput), ErrChunkFailed), ErrNotQuiesced), "bad_input")
		c.refuseNotice(s, n, wire.Code_BAD_INPUT, "bad_input", err)
		c.settle(r)
		return
	}
	r.chunks = append(r.chunks, ch)
	s.report.Chunks++
	if ch.Status == messages.Succeeded && c.r.Verify {
		c.pending = &pending{session: s, room: r, chunk: ch}
		c.emit(CallVerify{Session: s.Token, Chunk: cloneChunk(ch)})
		return
	}
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

// lateNotice handles a notice for a room this server released while the
// session still wrote it: the room is over on this side (the prefill is
// told so, without blame), and a final notice (the last chunk, or a
// failure that quiesced) means the session writes it no more.
func (c *Core) lateNotice(s *csession, n *wire.ChunkNotice, ch Chunk, err error) bool {
	late := false
	for r := range c.lingering {
		if r.id != n.Room || !r.reporters[s] && !r.dirty[s] {
			continue
		}
		late = true
		if err == nil && (ch.Last || ch.Status != messages.Succeeded && !ch.NotQuiesced) {
			delete(r.dirty, s)
			c.settle(r)
		}
	}
	if late {
		c.emit(AnswerNotice{Code: wire.Code_ROOM_FAILED, Text: fmt.Sprintf("room %d chunk [%d, %d): the decode server released the room before this chunk", n.Room, n.Start, n.End)})
		c.debug("notice of a released room", "prefill", s.Prefill, "room", n.Room, "start", n.Start, "end", n.End)
	}
	return late
}

// checkNotice turns a notice into a Chunk, checking what needs no room:
// status, range, page lists against the pool.
func (c *Core) checkNotice(s *csession, m *wire.ChunkNotice) (Chunk, error) {
	st, ok := statuses[m.Status]
	switch {
	case !ok:
		return Chunk{}, errors.Newf("room %d notice: status %d unknown", m.Room, m.Status)
	case m.Start < 0 || m.End < m.Start || m.End > int64(c.pages)*int64(s.PageSize):
		return Chunk{}, errors.Newf("room %d notice: chunk [%d, %d) is not a range within the pool's %d pages of %d tokens", m.Room, m.Start, m.End, c.pages, s.PageSize)
	case len(m.Positions) != len(m.DstPages):
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): %d positions, %d pages", m.Room, m.Start, m.End, len(m.Positions), len(m.DstPages))
	case len(m.DstPages) > c.pages:
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): %d pages, the pool has %d", m.Room, m.Start, m.End, len(m.DstPages), c.pages)
	case len(m.Error) > maxMetadataText:
		return Chunk{}, errors.Newf("room %d chunk [%d, %d): an error text of %d bytes (at most %d)", m.Room, m.Start, m.End, len(m.Error), maxMetadataText)
	}
	if _, err := cp.ChunkRange(int(m.Start), int(m.End), s.PageSize, m.Last); err != nil {
		return Chunk{}, errors.Wrapf(err, "room %d", m.Room)
	}
	ch := Chunk{Room: m.Room, Start: int(m.Start), End: int(m.End), Last: m.Last, Status: st, Err: m.Error,
		NotQuiesced: m.NotQuiesced, Bytes: m.Bytes, Positions: make([]int, len(m.Positions)), DstPages: make([]int, len(m.DstPages))}
	for i, p := range m.DstPages {
		if p < 0 || p >= int64(c.pages) {
			return Chunk{}, errors.Newf("room %d chunk [%d, %d): decode page %d at index %d is outside the pool of %d pages", m.Room, m.Start, m.End, p, i, c.pages)
		}
		// A request has one distinct decode page per position, so its
		// positions are below the pool's page count.
		if m.Positions[i] < 0 || m.Positions[i] >= int64(c.pages) {
			return Chunk{}, errors.Newf("room %d chunk [%d, %d): position %d at index %d is outside the pool's %d pages", m.Room, m.Start, m.End, m.Positions[i], i, c.pages)
		}
		ch.Positions[i], ch.DstPages[i] = int(m.Positions[i]), int(p)
	}
	return ch, nil
}

// claim checks a chunk's pages against its room: the Expected pages, or,
// for a room nobody Expected, pages no other room holds (each position one
// page); it claims the new ones.
func (c *Core) claim(r *croom, ch Chunk) error {
	where := func(format string, args ...any) error {
		return errors.Newf("room %d chunk [%d, %d): %s", ch.Room, ch.Start, ch.End, fmt.Sprintf(format, args...))
	}
	if r.expected {
		for i, pos := range ch.Positions {
			switch {
			case pos >= len(r.pages):
				return where("position %d is beyond the room's %d pages", pos, len(r.pages))
			case r.pages[pos] != ch.DstPages[i]:
				return where("position %d went to decode page %d, the room's page is %d", pos, ch.DstPages[i], r.pages[pos])
			}
		}
		return nil
	}
	fresh := map[int]int{} // page -> position, the chunk's new ones
	for i, pos := range ch.Positions {
		p := ch.DstPages[i]
		if have, ok := r.learned[pos]; ok {
			if have != p {
				return where("position %d went to decode page %d, an earlier chunk put it on page %d", pos, p, have)
			}
			continue
		}
		if q, ok := fresh[p]; ok && q != pos || c.owner[p] == r {
			return where("decode page %d holds two positions of the room", p)
		}
		if err := c.pageFree(p); err != nil {
			return where("%v", err)
		}
		fresh[p] = pos
	}
	for p, pos := range fresh {
		r.learned[pos] = p
		c.owner[p] = r
		r.held = append(r.held, p)
	}
	return nil
}

// pageFree says why page p cannot go to a new room, or nil.
func (c *Core) pageFree(p int) error {
	if c.quarantine[p] {
		return errors.Mark(errors.Newf("decode page %d may still be written by a prefill whose access could not be revoked: it is kept out for good", p), ErrNotQuiesced)
	}
	if o := c.owner[p]; o != nil {
		if o.released {
			return errors.Mark(errors.Newf("decode page %d is held by released room %d until its prefill's writes stopped", p, o.id), ErrNotQuiesced)
		}
		return errors.Newf("decode page %d belongs to room %d", p, o.id)
	}
	return nil
}

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
	switch r.group.Report(s.Rank, ch) {
	case Complete:
		r.complete = true
		s.report.Rooms++
		c.emit(RoomEnded{Room: r.snapshot(), Outcome: "complete"})
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
		c.failRoom(r, err, outcome)
	}
	c.settle(r)
}

// openRooms counts the rooms s reported in that have not ended.
func (c *Core) openRooms(s *csession) int {
	n := 0
	for r := range s.rooms {
		if !r.ended() && !r.released {
			n++
		}
	}
	return n
}

func cloneChunk(ch Chunk) Chunk {
	ch.Positions, ch.DstPages = slices.Clone(ch.Positions), slices.Clone(ch.DstPages)
	return ch
}

// --- rooms ---

func (c *Core) newRoom(id uint64, pages []int, from string) *croom {
	r := &croom{id: id, expected: pages != nil, pages: pages, from: from, reporters: map[*csession]bool{},
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
		// A rank lost and not back cannot report the room's chunks.
		for _, rank := range slices.Sorted(maps.Keys(c.lostRanks)) {
			if r.group.Lost(rank, c.lostRanks[rank]) == Failed {
				c.failRoom(r, errors.Mark(r.group.err, ErrPrefillLost), "lost")
				break
			}
		}
	}
	return r
}

func (c *Core) arm(t timer, after time.Duration) uint64 {
	c.nextTimer++
	c.timers[c.nextTimer] = t
	c.emit(ArmTimer{ID: c.nextTimer, After: after})
	return c.nextTimer
}

// ended reports whether the room's outcome is decided (published or
// waiting for revocations).
func (r *croom) ended() bool { return r.complete || r.err != nil || r.pendingErr != nil }

// quiet reports whether no peer may still write the room's pages.
func (r *croom) quiet() bool {
	return (r.complete || r.err != nil) && len(r.dirty) == 0 && !r.poisoned
}

func (r *croom) snapshot() Room {
	out := Room{ID: r.id, Pages: slices.Clone(r.pages), Complete: r.complete, Chunks: make([]Chunk, len(r.chunks))}
	for i, ch := range r.chunks {
		out.Chunks[i] = cloneChunk(ch)
	}
	return out
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

func (c *Core) publishFailure(r *croom, err error, outcome string) {
	if r.poisoned && !errors.Is(err, ErrNotQuiesced) {
		err = errors.Mark(errors.Wrap(err, "its prefill's access could not be revoked"), ErrNotQuiesced)
	}
	r.err, r.pendingErr = err, nil
	if outcome != "released" && outcome != "closed" { // not the prefill's doing
		for s := range r.reporters {
			if s.err == nil {
				s.err = err // a room it reported in did not complete
			}
		}
	}
	c.emit(RoomEnded{Room: r.snapshot(), Err: err, Outcome: outcome})
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
	if r.poisoned {
		for _, p := range r.held {
			c.quarantine[p] = true
		}
		if len(r.held) > 0 {
			c.emit(Quarantined{Pages: len(r.held)})
			c.warn("pages kept out for good: a prefill that may still write them could not be cut off", "room", r.id, "pages", len(r.held))
		}
	}
	for _, p := range r.held {
		if c.owner[p] == r {
			delete(c.owner, p)
		}
	}
	r.held = nil
	delete(c.lingering, r)
	if c.rooms[r.id] == r {
		delete(c.rooms, r.id)
	}
	for s := range r.reporters {
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

func (c *Core) expect(m ExpectMsg) {
	reply := func(err error) { c.emit(Reply{Err: err}) }
	switch {
	case c.closed:
		reply(ClosedError("Expect"))
		return
	case c.pool == nil:
		reply(BadInput("room %d: the decode pool is not sized yet", m.Room))
		return
	case len(m.Pages) == 0:
		reply(BadInput("room %d: no pages", m.Room))
		return
	case len(m.From) > MaxNameLen:
		reply(BadInput("room %d: prefill identity of %d bytes (at most %d)", m.Room, len(m.From), MaxNameLen))
		return
	case c.rooms[m.Room] != nil:
		reply(BadInput("room %d is already expected: Release it first", m.Room))
		return
	}
	seen := make(map[int]int, len(m.Pages))
	for i, p := range m.Pages {
		if p < 0 || p >= c.pages {
			reply(BadInput("room %d: page %d at index %d is outside the pool of %d pages", m.Room, p, i, c.pages))
			return
		}
		if j, dup := seen[p]; dup {
			reply(BadInput("room %d: page %d at index %d duplicates index %d", m.Room, p, i, j))
			return
		}
		if err := c.pageFree(p); err != nil {
			reply(errors.Mark(errors.Wrapf(err, "room %d: page at index %d", m.Room, i), ErrBadInput))
			return
		}
		seen[p] = i
	}
	r := c.newRoom(m.Room, slices.Clone(m.Pages), m.From)
	r.held = slices.Clone(m.Pages)
	for _, p := range r.held {
		c.owner[p] = r
	}
	reply(nil)
}

func (c *Core) release(m ReleaseMsg) {
	r := c.rooms[m.Room]
	if r == nil {
		c.emit(Reply{Err: BadInput("room %d is unknown", m.Room)})
		return
	}
	if !r.ended() {
		c.failRoom(r, errors.Mark(errors.Mark(errors.Newf("room %d released while in progress", r.id), ErrBadInput), ErrChunkFailed), "released")
		// Whoever writes it may still: its reporters, the sessions of the
		// identity it was Expected from, or, with neither (or in a group,
		// whose ranks all write), every open one.
		writers := maps.Clone(r.reporters)
		for _, s := range c.sessions {
			if s.state == sessionEnding {
				continue
			}
			if c.r.Group != nil || r.from != "" && s.Identity == r.from || r.from == "" && len(r.reporters) == 0 {
				writers[s] = true
			}
		}
		for s := range writers {
			if s.state != sessionEnding {
				r.dirty[s] = true
			}
		}
	}
	delete(c.rooms, r.id)
	r.released = true
	c.lingering[r] = true
	c.emit(Reply{})
	c.settle(r)
}

func (c *Core) lookup(m LookupMsg) {
	r := c.rooms[m.Room]
	if r == nil {
		c.emit(Reply{Err: BadInput("room %d is unknown: Expect it first", m.Room)})
		return
	}
	c.emit(Reply{Room: r.snapshot(), Err: r.err, Ended: r.complete || r.err != nil})
}

// --- goodbye, loss, revocation ---

func (c *Core) bye(m ByeMsg) {
	b := m.Bye
	if b == nil {
		c.emit(AnswerBye{Reply: m.Reply, Summary: &wire.Summary{Code: wire.Code_BAD_INPUT, Error: "bye: empty"}})
		return
	}
	s, why := c.sessionFor(m.From, b.Session)
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
	slices.SortFunc(incomplete, func(a, b *croom) int { return cmpUint(a.id, b.id) })
	var cause error
	switch {
	case aborted:
		text := b.Aborted
		if len(text) > maxMetadataText {
			text = text[:maxMetadataText]
		}
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
	delete(c.identities, s.key)
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

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (c *Core) departed(m DepartedMsg) {
	s := c.actors[m.Actor]
	switch {
	case s == nil:
		return
	case s.state == sessionBye && s.bye == nil:
		// It left having read its answer.
		c.end(s)
	case s.state == sessionOpen:
		// Anyone holding the prefill's certificate (anyone at all, in the
		// clear) can send a Terminated: the heartbeats decide.
		c.debug("prefill session actor reported gone; the session goes on while its node answers heartbeats", "prefill", s.Prefill, "actor", m.Actor)
	}
}

func (c *Core) disconnect(m DisconnectMsg) {
	var ss []*csession
	for _, s := range c.sessions {
		if s.Identity == m.Identity && s.state != sessionEnding {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		c.emit(Reply{Err: BadInput("no session of prefill %q", m.Identity)})
		return
	}
	slices.SortFunc(ss, func(a, b *csession) int { return cmpString(a.Token, b.Token) })
	c.emit(Reply{})
	cause := m.Cause
	if cause == nil {
		cause = errors.New("disconnected by the decode server")
	}
	for _, s := range ss {
		c.peerLost(PeerLostMsg{Session: s.Token, Cause: cause})
	}
}

func (c *Core) peerLost(m PeerLostMsg) {
	s := c.sessions[m.Session]
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
	if c.r.Group != nil {
		back := false
		for _, o := range c.sessions {
			back = back || o != s && o.state == sessionOpen && o.Rank == s.Rank
		}
		if !back {
			c.lostRanks[s.Rank] = lost
		}
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
			r.awaiting[s] = true
			r.dirty[s] = true
			c.failRoom(r, errors.Mark(errors.Wrapf(lost, "room %d", r.id), ErrPrefillLost), "lost")
		}
	}
	c.end(s)
}

// roomsByID lists the rooms in id order (effects come out in a stable
// order).
func (c *Core) roomsByID() []*croom {
	rs := make([]*croom, 0, len(c.rooms))
	for _, r := range c.rooms {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b *croom) int { return cmpUint(a.id, b.id) })
	return rs
}

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
	delete(c.identities, s.key)
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
	s := c.sessions[m.Session]
	if s == nil || !s.revoking || s.revoked {
		return
	}
	s.revoked = true
	confirmed := m.Err == nil
	if !confirmed {
		c.tainted = true
		msg := "access not confirmed revoked: the pool stays registered"
		if s.lost != nil || !s.said {
			// A prefill that did not say goodbye may still be writing.
			c.warn(msg, "prefill", s.Prefill, "error", m.Err.Error())
		} else {
			c.debug(msg, "prefill", s.Prefill, "error", m.Err.Error())
		}
	}
	all := c.roomsByID()
	for r := range c.lingering {
		all = append(all, r)
	}
	for _, r := range all {
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
	for r := range s.rooms {
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
	delete(c.sessions, s.Token)
	delete(c.actors, s.Actor)
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
		// Ranks that did not report may still be writing.
		for _, s := range c.sessions {
			if s.state != sessionEnding && (c.r.Group != nil || r.reporters[s] || s.Identity == r.ident || r.ident == "" && (r.from == "" || s.Identity == r.from)) {
				r.dirty[s] = true
			}
		}
		c.failRoom(r, errors.Mark(errors.Mark(errors.Newf("room %d: not complete within %v (Config.RoomTimeout)", r.id, c.r.RoomTimeout), ErrChunkFailed), ErrNotQuiesced), "timeout")
		c.settle(r)
	case byeTimer:
		if s := t.session; c.sessions[s.Token] == s && s.state == sessionBye {
			c.end(s)
		}
	}
}

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
	var ss []*csession
	for _, s := range c.sessions {
		ss = append(ss, s)
	}
	slices.SortFunc(ss, func(a, b *csession) int { return cmpString(a.Token, b.Token) })
	for _, s := range ss {
		// Open sessions' rooms failed above; their pages are quiet once the
		// access is revoked.
		for r := range s.rooms {
			if s.state == sessionOpen && !r.complete {
				r.dirty[s] = true
			}
		}
		c.end(s)
	}
	c.emit(Reply{Drained: len(c.sessions) == 0})
	c.maybeReleasePool()
	c.maybeDrained()
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// maybeReleasePool releases a pool nobody holds: one a Hello sized, once no
// session and no room holds it; any, once closed. Never while a page may
// still be written.
func (c *Core) maybeReleasePool() {
	if c.pool == nil || c.tainted || len(c.sessions) > 0 || c.pending != nil || len(c.lingering) > 0 || len(c.quarantine) > 0 {
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
	clear(c.owner)
	c.pool, c.pages = nil, 0
	c.pageSize = c.r.PageSize
	c.emit(ReleasePool{})
}

func (c *Core) maybeDrained() {
	if (c.draining || c.closed) && len(c.sessions) == 0 {
		c.emit(Drained{})
	}
}
