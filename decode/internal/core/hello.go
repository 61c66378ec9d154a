package core

import (
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages/wire"
)

// A prefill's Hello, checked before anything is sized or offered: its
// shape, its version, its sender, the server's state, its identity, its
// geometry. What follows (Admit, sizing the pool, the access point) is in
// admit.go.

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

// refuseHello answers a Hello with a refusal: its code, its reason (a
// metrics label) and the text the prefill's error carries.
func (c *Core) refuseHello(code wire.Code, reason string, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	// Logged before it is answered: whoever reads the answer finds the log.
	c.warn("hello refused", "reason", reason, "error", text)
	c.emit(AnswerHello{Code: code, Reason: reason, Text: text})
}

// hello checks a Hello, then asks for Admit's verdict (or goes on to
// admitted).
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
	name := Clip(h.Prefill, MaxNameLen)
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
	if s := c.departedFor(m); s != nil {
		// Its session actor was reported gone, and its own node (whose
		// heartbeats would keep it open until its grace ends: departed)
		// says Hello for its identity from another actor: a Dial
		// that gave up on its Hello, answered after the prefill's call
		// timeout (a slow Admit or Size), and a Dial after it. It ends as
		// lost, its access revoked first, and this Hello goes on: refused,
		// the prefill's identity stayed busy (and the session held a place
		// of MaxSessions) until an operator's Disconnect.
		c.peerLost(PeerLostMsg{Session: s.Token, Cause: errors.Newf("its session actor %s went away, and its node said Hello again from %s/%s", s.Actor, h.SessionAddress, h.SessionId)})
	}
	if s := c.helloAgain(m); s != nil {
		// Its first answer came after the prefill's call timeout (a slow
		// Admit or Size) and found no one waiting, and Dial said Hello
		// again: it gets the session's offer again. Refused, it left the
		// session open (its node answers heartbeats) and the prefill's
		// identity busy for as long as its node lived.
		c.debug("hello again: the session's offer again", "prefill", s.Prefill, "actor", s.Actor)
		c.heard(s) // its actor is there: a report of it gone was wrong
		c.emit(AnswerHello{Code: wire.Code_OK, Session: s.Token, Address: slices.Clone(s.address)})
		return
	}
	switch {
	case c.closed:
		c.refuseHello(wire.Code_UNAVAILABLE, "closed", "hello from %q: the decode server is closed", name)
		return
	case c.draining:
		c.refuseHello(wire.Code_UNAVAILABLE, "draining", "hello from %q: the decode server is draining (stopping): it takes no new session", name)
		return
	case c.sessions.open() >= c.r.MaxSessions:
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
	if s := c.sessions.live(key); s != nil {
		who := fmt.Sprintf("prefill %q", ident)
		if c.r.Group != nil {
			who = fmt.Sprintf("CP rank %d (prefill %q)", rank, s.Identity)
		}
		c.refuseHello(wire.Code_UNAVAILABLE, "identity_busy", "hello from %q: %s already has a live session from %s; a second one is refused until it ends",
			name, who, s.Node)
		return
	}
	actor := h.SessionAddress + "/" + h.SessionId
	if c.sessions.ofActor(actor) != nil {
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
	case c.ledger.pageSize != 0 && pageSize != c.ledger.pageSize:
		c.refuseHello(wire.Code_BAD_INPUT, "geometry", "hello from %q: page size %d tokens, the decode pool's is %d", name, pageSize, c.ledger.pageSize)
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

// helloAgain is the open session a Hello repeats: the same session actor,
// node, identity, name, page size, metadata and buffers, and nothing sent
// on it yet.
func (c *Core) helloAgain(m HelloMsg) *csession {
	h := m.Hello
	s := c.sessions.ofActor(h.SessionAddress + "/" + h.SessionId)
	ident := m.From.Peer
	if !c.r.TLS {
		ident = h.Prefill
	}
	if s == nil || s.state != sessionOpen || s.notices > 0 || s.Node != m.From.Node || s.Identity != ident ||
		s.Prefill != h.Prefill || s.PageSize != int(h.PageSize) || !maps.Equal(s.Metadata, h.Metadata) || len(s.layout) != len(h.Buffers) {
		return nil
	}
	for i, b := range h.Buffers {
		if s.layout[i] != (PrefillBuffer{Name: b.Name, Layer: int(b.Layer), ItemLen: b.ItemLen, Pages: b.Pages}) {
			return nil
		}
	}
	return s
}

// rankText names a session's rank in an error, in a group.
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

// departedFor is the open session a Hello from m's node would replace: of
// the Hello's identity (and rank, in a group), on the same node, its
// session actor reported gone, and not the Hello's own actor (that is a
// Hello again). Nil when there is none, or the Hello names no rank a
// group has (it is refused below).
func (c *Core) departedFor(m HelloMsg) *csession {
	h := m.Hello
	ident := m.From.Peer
	if !c.r.TLS {
		ident = h.Prefill
	}
	key := ident
	if g := c.r.Group; g != nil {
		r, err := strconv.Atoi(h.Metadata[RankKey])
		if err != nil || r < 0 || r >= g.Size {
			return nil
		}
		key = "rank " + strconv.Itoa(r)
	}
	s := c.sessions.live(key)
	if s == nil || !s.departed || s.state != sessionOpen || s.Node != m.From.Node || s.Identity != ident || s.Actor == h.SessionAddress+"/"+h.SessionId {
		return nil
	}
	return s
}
