package core

import (
	"fmt"
	"time"
)

// Rules is what the decode core knows of a Server's Config.
type Rules struct {
	MaxSessions        int
	MaxRoomsPerSession int
	// MaxChunksPerRoom bounds the distinct chunks a room holds (in a group
	// each may be reported by every rank owning its pages).
	MaxChunksPerRoom int
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
//     MaxRoomsPerSession rooms not yet ended or, nobody Expected, not
//     yet forgotten; a room holds at most MaxChunksPerRoom chunks;
//   - a room completes when its chunks tile the request to its last one,
//     each reported successful by exactly the ranks owning its pages (a
//     group of one: the session), and Verify accepted them;
//   - a loss is declared on evidence (the heartbeats), never on a
//     Terminated alone: one starts a grace that the session's next
//     message ends, and past which a silent session is lost; a lost
//     session's access is revoked before its rooms' failure is
//     published, and the failure says whether the pages are quiet (in a
//     group, its rooms' pages also wait for the other ranks that owe
//     them);
//   - no page is handed to another room while a peer may still write it:
//     pages of a room whose writer may still write are held until that
//     writer's access is revoked, and kept out for good when the revocation
//     could not be confirmed;
//   - an empty session completes nothing and leaves nothing behind.
type Core struct {
	r         Rules
	ledger    ledger            // the pool's pages and who holds them
	sessions  sessionTable      // who may speak
	rooms     map[uint64]*croom // not released
	timers    map[uint64]timer  // armed, not yet fired
	nextTimer uint64
	nextRoom  uint64 // numbers rooms in the order they were created
	pending   *pending
	draining  bool
	closed    bool

	out []Effect
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
	c := &Core{r: r, ledger: newLedger(r.PageSize), sessions: newSessionTable(), rooms: map[uint64]*croom{},
		timers: map[uint64]timer{}}
	if pool != nil {
		c.ledger.setPool(pool)
	}
	return c
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
	case CancelMsg:
		c.cancel(m)
	case CancelRoomMsg:
		c.cancelRoom(m)
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
		c.drain()
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
