package core

import (
	"time"

	"github.com/kvstream/kvstream/messages/wire"
)

// What goes into the core (Msg): messages from the network, from this
// process (heartbeats, revocations, timers, the serving stack's calls),
// and the results of the Call effects (effect.go).

// Msg is an input of the Core.
type Msg interface{ coreMsg() }

// Origin is who sent a message from the network: the node it came from
// (the sender PID's address) and its verified certificate name ("" in the
// clear).
type Origin struct {
	Node string
	Peer string
}

// Messages from the network, as decoded; the core validates every field.
type (
	// HelloMsg is a prefill's Hello; Token is the session token the
	// shell drew for it (random: later messages must carry it).
	HelloMsg struct {
		From  Origin
		Hello *wire.Hello
		Token string
	}
	// NoticeMsg is a chunk notice.
	NoticeMsg struct {
		From   Origin
		Notice *wire.ChunkNotice
	}
	// ByeMsg is a prefill's goodbye. Reply is the shell's name for its
	// answer, given back in AnswerBye: the answer may come while another
	// message is handled.
	ByeMsg struct {
		From  Origin
		Bye   *wire.Bye
		Reply string
	}
	// CancelMsg is a prefill's Cancel: a room it cancelled (its Drop
	// returned), or its answer to the server's Cancel of one.
	CancelMsg struct {
		From   Origin
		Cancel *wire.Cancel
	}
	// DepartedMsg says a watched prefill session actor was reported gone (a
	// Terminated, possibly for a closed connection). It is a suspicion, not
	// evidence: anyone holding the prefill's certificate, or any local
	// process in the clear, can send one.
	//
	// Grace bounds how long an open session stays open once its actor was
	// reported gone, unless it speaks again meanwhile (a notice, a
	// cancel, its actor's Hello again): then it ends as lost, its access
	// revoked first. The shell gives its node's heartbeat bound (a
	// Terminated starts the same clock as a silence). Zero leaves the
	// session to the heartbeats (traces recorded before the bound).
	DepartedMsg struct {
		Actor string // the session actor's PID, "address/id"
		Grace time.Duration
	}
)

// Messages from this process.
type (
	// PeerLostMsg: the session's heartbeat monitor heard nothing from the
	// prefill's node for its bound. This is the evidence of a loss.
	PeerLostMsg struct {
		Session string
		Cause   error
	}
	// RevokedMsg is the outcome of a Revoke: nil when nothing the
	// session's peer posted can land any more; an error (marked
	// ErrNotQuiesced) when the transport could not confirm that.
	RevokedMsg struct {
		Session string
		Err     error
	}
	// TimerMsg: the timer of an ArmTimer fired.
	TimerMsg struct{ ID uint64 }
	// ExpectMsg is Server.Expect: From, when set, is the only prefill
	// identity (certificate name; in the clear, the prefill's name) whose
	// session may report the room.
	ExpectMsg struct {
		Room  uint64
		Pages []int
		From  string
	}
	// ReleaseMsg is Server.Release.
	ReleaseMsg struct{ Room uint64 }
	// CancelRoomMsg is Server.Cancel: the decode side gives a room up.
	CancelRoomMsg struct {
		Room  uint64
		Cause string
	}
	// DisconnectMsg is Server.Disconnect: the sessions of the identity are
	// cut off as if lost.
	DisconnectMsg struct {
		Identity string
		Cause    error
	}
	// LookupMsg is the first half of Server.Wait: the room now, and whether
	// it ended.
	LookupMsg struct{ Room uint64 }
	// DrainMsg stops accepting sessions; the sessions that are open go on.
	DrainMsg struct{}
	// CloseMsg ends every session and room.
	CloseMsg struct{}
	// StateMsg asks for the core's counts (Server.State).
	StateMsg struct{}
)

// Results of Call effects.
type (
	// AdmittedMsg answers CallAdmit.
	AdmittedMsg struct{ Err error }
	// SizedMsg answers CallSize: the pool the shell allocated and
	// registered (on error nothing stays registered).
	SizedMsg struct {
		Buffers []Buffer
		Err     error
	}
	// AccessMsg answers CallOpenAccess: the address the session's peer
	// connects to, and whether the transport can revoke it alone.
	AccessMsg struct {
		Address   []byte
		Revocable bool
		Err       error
	}
	// VerifiedMsg answers CallVerify.
	VerifiedMsg struct{ Err error }
)

func (HelloMsg) coreMsg()      {}
func (NoticeMsg) coreMsg()     {}
func (ByeMsg) coreMsg()        {}
func (DepartedMsg) coreMsg()   {}
func (CancelMsg) coreMsg()     {}
func (CancelRoomMsg) coreMsg() {}
func (PeerLostMsg) coreMsg()   {}
func (RevokedMsg) coreMsg()    {}
func (TimerMsg) coreMsg()      {}
func (ExpectMsg) coreMsg()     {}
func (ReleaseMsg) coreMsg()    {}
func (DisconnectMsg) coreMsg() {}
func (LookupMsg) coreMsg()     {}
func (DrainMsg) coreMsg()      {}
func (CloseMsg) coreMsg()      {}
func (StateMsg) coreMsg()      {}
func (AdmittedMsg) coreMsg()   {}
func (SizedMsg) coreMsg()      {}
func (AccessMsg) coreMsg()     {}
func (VerifiedMsg) coreMsg()   {}
