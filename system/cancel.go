package system

import (
	"context"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"go.uber.org/zap"
)

// maxCancelled bounds the rooms a decode cancelled that the engine keeps
// refusing: the most recent ones stay, the oldest go first.
const maxCancelled = 4096

// maxCancelReason bounds the reason kept with a cancelled room.
const maxCancelReason = 1024

type peerRoom struct {
	peer string
	room uint64
}

// cancelledRooms are the rooms decode peers cancelled (CancelRoom), which
// Register refuses toward them. mu orders a registration against a cancel:
// Register holds it for reading from its check until its chunk is handed
// to the manager, CancelRoom for writing from its record until its Drop is
// handed over, so that a chunk of the room is either refused or reached by
// the Drop.
type cancelledRooms struct {
	mu    sync.RWMutex
	set   map[peerRoom]error
	order []peerRoom // oldest first
}

// check returns why a chunk of the spec's room is refused, or nil; the
// caller holds mu for reading.
func (c *cancelledRooms) check(spec *plan.ChunkSpec) error {
	if len(c.set) == 0 {
		return nil
	}
	for _, in := range spec.Infos {
		if err := c.set[peerRoom{in.Peer, spec.Room}]; err != nil && !in.Dummy {
			return err
		}
	}
	return nil
}

// record keeps a cancelled room; first says whether it was not kept yet.
// The caller holds mu for writing.
func (c *cancelledRooms) record(k peerRoom, err error) (first bool) {
	if c.set == nil {
		c.set = map[peerRoom]error{}
	}
	if _, ok := c.set[k]; ok {
		return false
	}
	if len(c.order) >= maxCancelled {
		delete(c.set, c.order[0])
		c.order = c.order[1:]
	}
	c.set[k] = err
	c.order = append(c.order, k)
	return true
}

// forget drops the rooms peer cancelled. The caller holds mu for writing.
func (c *cancelledRooms) forget(peer string) {
	kept := c.order[:0]
	for _, k := range c.order {
		if k.peer == peer {
			delete(c.set, k)
		} else {
			kept = append(kept, k)
		}
	}
	clear(c.order[len(kept):])
	c.order = kept
}

// CancelRoom is a decode peer's cancel of a room (its scheduler gave the
// request up; decode.Client.Attach calls it): from now on Register refuses
// every chunk of the room toward that peer (ErrRoomCancelled, also
// ErrBadInput), the serving stack hears of it (WithRoomCancelled), and if
// a live chunk of the room has a destination on the peer the room is
// dropped as Drop does. It returns once no write of the room can land on
// the peer any more: nil when the room was dropped quietly or has no live
// chunk toward the peer (a chunk toward other peers only is left alone: a
// decode cancels only what it receives). Any other error means writes may
// still land there: ErrNotQuiesced (a teardown that could not stop them),
// ErrClosed, ErrBadInput (an unknown peer), or a bug's assertion failure.
// The engine keeps the last 4096 rooms cancelled this way.
func (e *Engine) CancelRoom(ctx context.Context, peer string, room uint64, reason string) (err error) {
	defer func() { err = public(err) }()
	if !e.enter() {
		return closedError("CancelRoom")
	}
	defer e.leave()
	if _, ok := e.env.Peers.Get(peer); !ok {
		return errors.Mark(errors.Newf("cancel room %d: unknown peer %q", room, peer), ErrBadInput)
	}
	if len(reason) > maxCancelReason {
		// Cut at a character's start: a reason cut inside one is not
		// UTF-8, and the serving stack may pass it on in a protobuf
		// string, which refuses to marshal it.
		n := maxCancelReason
		for n > 0 && !utf8.RuneStart(reason[n]) {
			n--
		}
		reason = reason[:n]
	}
	if reason == "" {
		reason = "no reason given"
	}
	why := errors.Mark(errors.Mark(errors.Newf("room %d was cancelled by its decode peer %q (%s): nothing registered", room, peer, reason),
		ErrRoomCancelled), ErrBadInput)
	timeout := e.timeout(ctx)
	reply := make(chan []Result, 1)
	e.cancels.mu.Lock()
	first := e.cancels.record(peerRoom{peer, room}, why)
	e.system.Root.Send(e.manager, &messages.Drop{Room: room, Timeout: timeout, Peer: peer, Reply: reply})
	e.cancels.mu.Unlock()
	if first {
		e.log.Debug("room cancelled by its decode peer: its chunks toward it are dropped and refused", zap.String("peer", peer), zap.Uint64("room", room), zap.String("reason", reason))
		for _, f := range e.onCancelled {
			f(peer, room, reason)
		}
	}
	select {
	case rs := <-reply:
		err := dropResult(rs)
		if errors.Is(err, ErrNoChunk) {
			return nil // nothing of it goes to the peer
		}
		return err
	case <-time.After(timeout + e.grace):
		return unanswered("a decode peer's cancel", room, timeout+e.grace)
	}
}
