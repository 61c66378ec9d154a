package core

import (
	"time"

	"github.com/kvstream/kvstream/messages/wire"
)

// What comes out of the core (Effect): answers, Calls, and what the shell
// does for sessions, rooms, timers and the pool.

// Effect is an output of the Core.
type Effect interface{ coreEffect() }

// Answers to the message being handled.
type (
	// AnswerHello answers a Hello: an offer (Code OK: the session's token
	// and the address its peer connects to; the shell adds the pool's
	// regions) or a refusal with its code, its reason (a metrics label)
	// and the text the prefill's error will carry.
	AnswerHello struct {
		Code    wire.Code
		Reason  string
		Text    string
		Session string
		Address []byte
	}
	// AnswerNotice answers a chunk notice. Reason is set when the notice
	// was refused (a metrics label).
	AnswerNotice struct {
		Code   wire.Code
		Reason string
		Text   string
	}
	// AnswerBye answers the goodbye Reply names with the decode side's
	// verdict: at once for a refusal, else once the session's access is
	// revoked.
	AnswerBye struct {
		Reply   string
		Summary *wire.Summary
	}
	// AnswerCancel answers a prefill's Cancel. Reason is set when it was
	// refused (a metrics label).
	AnswerCancel struct {
		Code   wire.Code
		Reason string
		Text   string
	}
	// Reply answers a call of this process (Expect, Release, Lookup,
	// Drain, Close, State, Cancel). Room is Lookup's room, Ended whether
	// it ended; Drained whether no session is open any more. A Cancel
	// that took effect is followed by CancelSettled, in the same step or
	// a later one.
	Reply struct {
		Err     error
		Room    Room
		Ended   bool
		Drained bool
		State   State
		// Instance is the room a cancel took effect on (CancelRoomMsg):
		// its CancelSettled carries it; or the room Lookup found, which
		// its RoomEnded carries.
		Instance uint64
	}
)

// Calls: the shell performs them and steps the core with the result.
type (
	// CallAdmit runs Config.Admit; result AdmittedMsg.
	CallAdmit struct {
		Prefill  string
		Metadata map[string]string
	}
	// CallSize runs Config.Size and registers its pool; result SizedMsg.
	CallSize struct{ Layout []PrefillBuffer }
	// CallOpenAccess opens the access point the new session's peer will
	// write through (rdma.PeerAccessor), or answers with the transport's
	// address when it has none; result AccessMsg.
	CallOpenAccess struct{ Session string }
	// CallVerify runs Config.Verify on a successful chunk; result
	// VerifiedMsg.
	CallVerify struct {
		Session string
		Chunk   Chunk
	}
)

// Sessions, rooms, timers and the pool.
type (
	// SessionOpened: a session was offered. The shell watches its actor
	// and its node's heartbeats, binds its peer on the node, and hands it
	// to Accept.
	SessionOpened struct{ Session SessionInfo }
	// Revoke cuts the session's peer off the pool (rdma.PeerAccess.Revoke,
	// bounded in time; RevokeLost for a Lost peer, which stopped
	// answering); result, later and through the mailbox: RevokedMsg.
	Revoke struct {
		Session string
		Lost    bool
	}
	// SessionEnded: the session is over and its access revoked (or known
	// not to be). The shell stops watching it, unbinds its peer and
	// reports it to Session.Wait; Outcome is a metrics label.
	SessionEnded struct {
		Session string
		Report  SessionReport
		Err     error
		Outcome string
	}
	// RoomEnded: the room completed (Err nil) or failed; Outcome is a
	// metrics label. The shell wakes Wait and calls Config.OnRoomEnd.
	RoomEnded struct {
		Room    Room
		Err     error
		Outcome string
		// Instance names the room among the rooms of its id, as Lookup's
		// Reply does: a room released before its failure was published
		// ends after its id may have been Expected again, and its end is
		// not the newer room's.
		Instance uint64
	}
	// ArmTimer asks for a TimerMsg with ID after After.
	ArmTimer struct {
		ID    uint64
		After time.Duration
	}
	// ReleasePool deregisters the pool (and frees it with Config.Free when
	// Config.Size made it): no session is open, no page may still be
	// written.
	ReleasePool struct{}
	// Verified counts the bytes of a chunk that passed Config.Verify.
	Verified struct{ Bytes uint64 }
	// Quarantined: pages that a peer may still write, and that the
	// transport could not confirm revoked, are kept out of every room and
	// the pool is never released while this process lives.
	Quarantined struct{ Pages int }
	// Drained: draining, and no session is open any more.
	Drained struct{}
	// TellCancel tells a session's prefill that the server cancelled a
	// room (wire.Cancel to its session actor): it drops the room and
	// answers with a Cancel once no write of it can land.
	TellCancel struct {
		Session string
		Room    uint64
		Reason  string
	}
	// Cancelled counts a room cancelled, by who cancelled it: "decode"
	// (Server.Cancel) or "prefill" (its Cancel); a metrics label.
	Cancelled struct {
		Room      uint64
		Direction string
	}
	// CancelSettled: no write of a room the server cancelled can land any
	// more (every prefill that could write it answered, or its access was
	// revoked), and its pages went back to the pool: Server.Cancel
	// returns. NotQuiesced: a writer's access could not be confirmed
	// revoked, and the pages are kept out for good instead.
	CancelSettled struct {
		Room uint64
		// Instance names the room among the rooms of its id (a room
		// released can be Expected again): what the Cancel's Reply said.
		Instance    uint64
		NotQuiesced bool
	}
	// TellDrain tells an open session's prefill that this server drains
	// (wire.Drain, to the session actor its Hello named): it registers no
	// new room here, finishes those in flight and says goodbye, so that
	// the drain ends as soon as its rooms are done instead of at the
	// serving stack's drain timeout.
	TellDrain struct{ Session string }
)

// Level is a log effect's level.
type Level int

// Log levels: the shell logs Debug at DEBUG and Warn at WARN (the error's
// text, no stack: expected events are not bugs).
const (
	Debug Level = iota
	Warn
)

// Log asks the shell to log Msg with the fields (key, value pairs).
type Log struct {
	Level  Level
	Msg    string
	Fields []any
}

func (AnswerHello) coreEffect()    {}
func (AnswerNotice) coreEffect()   {}
func (AnswerBye) coreEffect()      {}
func (Reply) coreEffect()          {}
func (CallAdmit) coreEffect()      {}
func (CallSize) coreEffect()       {}
func (CallOpenAccess) coreEffect() {}
func (CallVerify) coreEffect()     {}
func (SessionOpened) coreEffect()  {}
func (Revoke) coreEffect()         {}
func (SessionEnded) coreEffect()   {}
func (RoomEnded) coreEffect()      {}
func (ArmTimer) coreEffect()       {}
func (ReleasePool) coreEffect()    {}
func (Verified) coreEffect()       {}
func (Quarantined) coreEffect()    {}
func (Drained) coreEffect()        {}
func (TellDrain) coreEffect()      {}
func (AnswerCancel) coreEffect()   {}
func (TellCancel) coreEffect()     {}
func (Cancelled) coreEffect()      {}
func (CancelSettled) coreEffect()  {}
func (Log) coreEffect()            {}

// SessionInfo is what the shell learns of a new session.
type SessionInfo struct {
	Token    string
	Prefill  string // the Hello's name
	Identity string // the certificate name; in the clear, the prefill's name
	Node     string // the prefill node's address
	Actor    string // its session actor, "address/id"
	Rank     int
	PageSize int
	Metadata map[string]string
}

// State is what the core holds now: for readiness and metrics.
type State struct {
	Sessions      int  // open sessions
	Rooms         int  // rooms not released
	RoomsInFlight int  // rooms neither released nor ended
	Pooled        bool // the pool is registered
	PoolBytes     uint64
	PagesHeld     int // pages rooms hold (a page of every buffer each)
	// PagesAwaitingRevocation are pages held by rooms that are over (ended
	// or released) while a prefill that may write them is being cut off.
	PagesAwaitingRevocation int
	Draining                bool
	Closed                  bool
	Quarantined             int  // pages kept out for good
	Tainted                 bool // a revocation was not confirmed: the pool is never released
}
