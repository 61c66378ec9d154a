package netsec

import (
	"sort"
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

// SessionPolicy is an Authorize for a node that serves sessions with peers.
// Only authenticated peers may deliver, only to the local actors it allows
// (and to this node's futures, which carry the answers to its own
// requests), never Stop, PoisonPill or Touch, and only for hosts their
// certificates name (CheckSender). Once a session is bound, only the peers
// bound to a session may deliver, except to the open actors (a server that
// must answer every Hello, a refusal included, rather than let the peer's
// stream be cut and its request time out). It is safe for concurrent use.
type SessionPolicy struct {
	mu       sync.Mutex
	allowed  map[string]bool
	open     map[string]bool
	prefixes []string       // open: every local actor whose id starts so
	peers    map[string]int // bound peer name -> sessions
}

// NewSessionPolicy allows delivery to the local actors of the given ids.
func NewSessionPolicy(ids ...string) *SessionPolicy {
	p := &SessionPolicy{allowed: map[string]bool{}, open: map[string]bool{}, peers: map[string]int{}}
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

// Open lets any authenticated peer deliver to the local actors of the
// given ids even while sessions are bound to other peers (they must check
// who speaks themselves: a server answering Hellos). It implies Allow.
func (p *SessionPolicy) Open(ids ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		p.allowed[id] = true
		p.open[id] = true
	}
}

// OpenPrefix opens every local actor whose id starts with prefix, existing
// or not: a message to one that does not exist is then answered by the
// node (protoactor's DeadLetterResponse, which fails the sender's request
// at once) instead of cutting the sender's stream, so a peer that names a
// server wrongly hears so.
func (p *SessionPolicy) OpenPrefix(prefix string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prefixes = append(p.prefixes, prefix)
}

// isOpen reports whether id is open; p.mu is held.
func (p *SessionPolicy) isOpen(id string) bool {
	if p.open[id] {
		return true
	}
	for _, pre := range p.prefixes {
		if strings.HasPrefix(id, pre) {
			return true
		}
	}
	return false
}

// Forbid takes back Allow and Open: an actor of a session that ended.
func (p *SessionPolicy) Forbid(ids ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		delete(p.allowed, id)
		delete(p.open, id)
	}
}

// Bound lists the peers bound to a session, sorted.
func (p *SessionPolicy) Bound() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.peers))
	for name := range p.peers {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Bind adds a session with the peer named name (its PeerName): from then
// on, until every session of theirs is unbound, only bound peers may
// deliver to actors that are not open.
func (p *SessionPolicy) Bind(name string) error {
	if name == "" {
		return errors.New("session: cannot bind an unauthenticated peer")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.peers[name]++
	return nil
}

// Unbind ends one session of Bind's with the peer named name.
func (p *SessionPolicy) Unbind(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.peers[name] > 1 {
		p.peers[name]--
		return
	}
	delete(p.peers, name)
}

// ErrNotServed marks an Authorize refusal whose only fault is its target:
// an actor the node does not serve to peers, named by a peer otherwise
// allowed to deliver. StreamGuard (as ServerOptions wires it) answers such
// a request (an envelope with a sender) as protoactor answers one to an
// actor that does not exist, with a DeadLetterResponse that fails the
// sender's future at once, and delivers the rest of the batch; anything
// else it refuses is refused whole, the stream cut.
var ErrNotServed = errors.New("actor not served to peers")

// refusedTypes are protoactor's messages that make a target stop or answer
// on a peer's behalf; the session protocol needs none of them.
var refusedTypes = map[string]bool{"actor.Stop": true, "actor.PoisonPill": true, "actor.Touch": true}

// Authorize implements Authorize.
func (p *SessionPolicy) Authorize(peer Identity, e Envelope) error {
	if !peer.Authenticated() {
		return ErrUnauthenticated
	}
	p.mu.Lock()
	bound := len(p.peers) > 0 && p.peers[peer.Name()] == 0 && !p.isOpen(e.Target.Id)
	p.mu.Unlock()
	if bound {
		return errors.Newf("%q is not the peer of any session of this node", peer.Name())
	}
	// The sender first: a refusal marked ErrNotServed is answered, and an
	// answer may go only to a host the peer's certificate names.
	if err := CheckSender(peer, e); err != nil {
		return err
	}
	return p.AuthorizeLocal(e)
}

// AuthorizeLocal applies the rules that need no identity: only the allowed
// actors and this node's futures (any other target is refused, marked
// ErrNotServed), never Stop, PoisonPill or Touch. It is what a plaintext
// (loopback, development) node can still enforce, where peers have no
// names to bind a session to.
func (p *SessionPolicy) AuthorizeLocal(e Envelope) error {
	if refusedTypes[e.TypeName] {
		return errors.Newf("%s from a peer refused", e.TypeName)
	}
	p.mu.Lock()
	allowed := p.allowed[e.Target.Id] || p.isOpen(e.Target.Id)
	p.mu.Unlock()
	if !allowed && !strings.HasPrefix(e.Target.Id, "future$") {
		return errors.Mark(errors.Newf("actor %q does not accept messages from peers", e.Target.Id), ErrNotServed)
	}
	return nil
}
