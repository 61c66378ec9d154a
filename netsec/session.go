package netsec

import (
	"strings"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
)

// PeerHeader is the message header in which StreamGuard hands every
// delivered message the verified name (Identity.Name) of the peer that sent
// it; absent for an unauthenticated peer. The guard overwrites or removes
// any value the peer put there, so an actor can trust it: read it with
// PeerName.
const PeerHeader = "netsec-peer"

// PeerName is the verified name of the peer that sent the message ctx is
// processing, or "" for a local sender or an unauthenticated peer. System
// messages carry no header: guard them with an Authorize.
func PeerName(ctx actor.Context) string {
	if h := ctx.MessageHeader(); h != nil {
		return h.Get(PeerHeader)
	}
	return ""
}

// SessionPolicy is an Authorize for a node that serves one session with one
// peer at a time. Only authenticated peers may deliver, only to the local
// actors it allows (and to this node's futures, which carry the answers to
// its own requests), never Stop, PoisonPill or Touch, and only for hosts
// their certificates name (CheckSender). Once bound, only the bound peer
// may deliver at all. It is safe for concurrent use.
type SessionPolicy struct {
	mu      sync.Mutex
	allowed map[string]bool
	peer    string
}

// NewSessionPolicy allows delivery to the local actors of the given ids.
func NewSessionPolicy(ids ...string) *SessionPolicy {
	p := &SessionPolicy{allowed: map[string]bool{}}
	p.Allow(ids...)
	return p
}

// Allow lets peers deliver to more local actors (by PID id), for example
// an actor spawned for the session.
func (p *SessionPolicy) Allow(ids ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		p.allowed[id] = true
	}
}

// Forbid takes back Allow: an actor of a session that ended.
func (p *SessionPolicy) Forbid(ids ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		delete(p.allowed, id)
	}
}

// Bound is the peer the policy is bound to, or "".
func (p *SessionPolicy) Bound() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peer
}

// Bind restricts delivery to the peer named name (its PeerName), typically
// when the session's first message arrives. Binding again to the same name
// is a no-op; to another name, an error: one session at a time.
func (p *SessionPolicy) Bind(name string) error {
	if name == "" {
		return errors.New("session: cannot bind an unauthenticated peer")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.peer != "" && p.peer != name {
		return errors.Newf("session: already bound to %q, refusing %q", p.peer, name)
	}
	p.peer = name
	return nil
}

// Unbind ends the session: any authenticated peer may deliver again.
func (p *SessionPolicy) Unbind() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.peer = ""
}

// refusedTypes are protoactor's messages that make a target stop or answer
// on a peer's behalf; the session protocol needs none of them.
var refusedTypes = map[string]bool{"actor.Stop": true, "actor.PoisonPill": true, "actor.Touch": true}

// Authorize implements Authorize.
func (p *SessionPolicy) Authorize(peer Identity, e Envelope) error {
	if !peer.Authenticated() {
		return ErrUnauthenticated
	}
	p.mu.Lock()
	bound := p.peer
	p.mu.Unlock()
	if bound != "" && peer.Name() != bound {
		return errors.Newf("%q is not this session's peer (%q)", peer.Name(), bound)
	}
	if err := p.AuthorizeLocal(e); err != nil {
		return err
	}
	return CheckSender(peer, e)
}

// AuthorizeLocal applies the rules that need no identity: only the allowed
// actors and this node's futures, never Stop, PoisonPill or Touch. It is
// what a plaintext (loopback, development) node can still enforce, where
// peers have no names to bind a session to.
func (p *SessionPolicy) AuthorizeLocal(e Envelope) error {
	if refusedTypes[e.TypeName] {
		return errors.Newf("%s from a peer refused", e.TypeName)
	}
	p.mu.Lock()
	allowed := p.allowed[e.Target.Id]
	p.mu.Unlock()
	if !allowed && !strings.HasPrefix(e.Target.Id, "future$") {
		return errors.Newf("actor %q does not accept messages from peers", e.Target.Id)
	}
	return nil
}
