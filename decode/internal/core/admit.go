package core

import (
	"maps"
	"slices"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages/wire"
)

// The Hello's Calls, in order: Admit (CallAdmit), sizing the pool from
// its layout when a Hello sizes it (CallSize), the session's access point
// (CallOpenAccess); the session opens with the last one's answer. Any
// failure refuses the Hello, and a pool it sized is released again.

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

// admitted takes Admit's verdict: the pool is sized from the layout when
// a Hello sizes it, else the layout is matched against it.
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
	if c.ledger.sized() {
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

// sized takes the pool the shell allocated and registered for the Hello.
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
	c.ledger.setPool(m.Buffers)
	p.sized = true
	c.matched(p)
}

// matched checks the Hello's layout against the pool, then asks for the
// session's access point.
func (c *Core) matched(p *pending) {
	name := p.hello.Hello.Prefill
	if err := MatchLayout(c.ledger.pool, p.layout); err != nil {
		c.failHello(wire.Code_BAD_INPUT, "geometry", "hello from %q: %v", name, err)
		return
	}
	c.emit(CallOpenAccess{Session: p.hello.Token})
}

// accessed opens the session with its access point, and answers the
// Hello with the offer.
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
		key: p.key, rooms: map[*croom]bool{}, address: slices.Clone(m.Address), layout: slices.Clone(p.layout)}
	s.report.Prefill = h.Prefill
	c.sessions.add(s)
	c.ledger.pageSize = p.pageSize
	c.emit(SessionOpened{Session: s.SessionInfo}, AnswerHello{Code: wire.Code_OK, Session: s.Token, Address: slices.Clone(m.Address)})
	if c.draining {
		// The drain began while its Hello was being answered.
		c.emit(TellDrain{Session: s.Token})
	}
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
