package core

import (
	"cmp"
	"iter"
	"maps"
	"slices"
)

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
	// departed: its session actor was reported gone while it was open (a
	// suspicion: see departed); a Hello from its node for its identity
	// from another actor then ends it (hello), and so does its
	// departTimer, the grace's (DepartedMsg.Grace), unless it speaks
	// again first (heard).
	departed    bool
	departTimer uint64
	// revoking: its Revoke went out; revoked: the RevokedMsg came back.
	revoking, revoked bool
	// bye is the Bye's answer, held until the access is revoked: the
	// prefill learns its verdict only once nothing it posts can land.
	bye   *AnswerBye
	rooms map[*croom]bool
	// pageless counts the successful chunks of no page (a non-last chunk
	// shorter than a page) it reported in rooms nobody Expected that are
	// not forgotten: such a chunk claims no pool page, so the pool does not
	// bound them as it bounds the others; this count, at most the pool's
	// pages, does.
	pageless int
	// address is where its Offer sent the prefill (its access point): a
	// Hello repeated gets the same offer (helloAgain).
	address []byte
	// layout is the prefill's buffers its Hello gave and the pool
	// matched (or was sized by): a Hello repeated with another is no
	// repeat.
	layout []PrefillBuffer
	// ended are the ids of rooms it reported in that ended and were
	// forgotten (nobody Expected them), oldest first, at most
	// MaxRoomsPerSession: a later notice of one is the prefill's mistake,
	// not a new room (which its last chunk alone could complete).
	ended []uint64
}

// sessionTable is who may speak: every session until its end was
// reported, by token; the open ones by identity (and rank, in a group);
// every one by its watched session actor; and a group's ranks that were
// lost and are not back.
//
// Between any two messages (checked by the fuzz test): an identity names
// an open session listed by its token under that identity.
type sessionTable struct {
	byToken map[string]*csession
	byKey   map[string]*csession
	byActor map[string]*csession
	// lostRanks are a group's ranks whose last session was lost, until one
	// of theirs says Hello again: a room that needs one fails at once.
	lostRanks map[int]error
}

func newSessionTable() sessionTable {
	return sessionTable{byToken: map[string]*csession{}, byKey: map[string]*csession{}, byActor: map[string]*csession{},
		lostRanks: map[int]error{}}
}

// get is the session of token, until its end was reported.
func (t *sessionTable) get(token string) *csession { return t.byToken[token] }

// live is the open session of key (an identity, or a rank in a group).
func (t *sessionTable) live(key string) *csession { return t.byKey[key] }

// ofActor is the session whose session actor is actor ("address/id").
func (t *sessionTable) ofActor(actor string) *csession { return t.byActor[actor] }

// len counts the sessions whose end was not reported yet.
func (t *sessionTable) len() int { return len(t.byToken) }

// all lists the sessions whose end was not reported yet, in no order.
func (t *sessionTable) all() iter.Seq[*csession] { return maps.Values(t.byToken) }

// sorted lists the sessions whose end was not reported yet, by token
// (effects come out in a stable order).
func (t *sessionTable) sorted() []*csession {
	return slices.SortedFunc(t.all(), byToken)
}

// ofIdentity lists the identity's sessions that are not ending, by token.
func (t *sessionTable) ofIdentity(identity string) []*csession {
	var ss []*csession
	for s := range t.all() {
		if s.Identity == identity && s.state != sessionEnding {
			ss = append(ss, s)
		}
	}
	slices.SortFunc(ss, byToken)
	return ss
}

func byToken(a, b *csession) int { return cmp.Compare(a.Token, b.Token) }

// open counts the sessions not ending.
func (t *sessionTable) open() int {
	n := 0
	for s := range t.all() {
		if s.state != sessionEnding {
			n++
		}
	}
	return n
}

// add lists a new open session; its rank, in a group, is back.
func (t *sessionTable) add(s *csession) {
	t.byToken[s.Token] = s
	t.byKey[s.key] = s
	t.byActor[s.Actor] = s
	delete(t.lostRanks, s.Rank) // back: new rooms may count on it again
}

// retire frees the session's identity: it sends nothing more, and its
// identity may open a new session.
func (t *sessionTable) retire(s *csession) { delete(t.byKey, s.key) }

// remove forgets a session whose end was reported.
func (t *sessionTable) remove(s *csession) {
	delete(t.byToken, s.Token)
	delete(t.byActor, s.Actor)
}

// rankBack reports whether another open session holds s's rank.
func (t *sessionTable) rankBack(s *csession) bool {
	back := false
	for o := range t.all() {
		back = back || o != s && o.state == sessionOpen && o.Rank == s.Rank
	}
	return back
}

// sessionFor finds the sender's open session, or says why not: the token
// must name a session of the sender's node and, with TLS, of its verified
// name.
func (t *sessionTable) sessionFor(from Origin, token string, tls bool) (*csession, string) {
	s := t.byToken[token]
	switch {
	case s == nil:
		return nil, "no such session"
	case from.Node != s.Node:
		return nil, "not the session's node"
	case tls && from.Peer != s.Identity:
		return nil, "not the session's peer"
	case s.state != sessionOpen:
		return nil, "the session ended"
	}
	return s, ""
}
