package system

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/plan"
	"go.uber.org/zap"
)

// RemovePeerWhenIdle forgets the decode peer p (as passed to AddPeer,
// Sharding included) of a session that ended, as RemovePeer does, without refusing a peer still in
// use: it removes the peer now when no live chunk sends to it, else the
// moment the last of those chunks ends (finished, failed or dropped: the
// serving stack still ends their rooms, and their writes are quiesced as
// always before the record and the endpoints go), before that chunk's
// Finish or Drop returns. From this call until the removal, Register
// refuses every new chunk toward the peer (ErrPeerLost: its session ended,
// nothing sent to it can be used). decode.Client's Bye and Close call it,
// so that a session that ends before its rooms there did leaves no peer
// behind in a prefill that serves ever-new decode sessions.
//
// The removal is bound to p's record: only a peer that still holds the
// pool p describes (plan.Peer.SamePool) is removed, so that a late call for
// a session that ended does not remove a later session's peer added under
// the same id, wherever sessions differ in their pools (the decode server
// gives each session an access point of its own where its transport can
// revoke one: UCX and the loopback fabric do). A peer not held any more (removed already, or added again
// with another pool) is nil: nothing of that session is left. A second call
// before the removal changes nothing; a closed engine holds no peer (nil).
func (e *Engine) RemovePeerWhenIdle(p Peer) (err error) {
	defer func() { err = public(err) }()
	if !e.enter() {
		return nil
	}
	defer e.leave()
	id := p.ID
	e.cancels.mu.Lock()
	rec, held := e.env.Peers.Get(id)
	held = held && rec.SamePool(&p)
	_, marked := e.removing[id]
	n := 0
	switch {
	case !held, marked:
	default:
		// Counted and watched under the registry's lock, and no
		// registration toward the peer is between its check and its
		// hand-off (Register holds this lock for reading from its check
		// on): every chunk that sends to it is counted, and the end of the
		// last one is heard (peerIdle).
		if n = e.env.Registry.WatchIdle(id); n > 0 {
			if e.removing == nil {
				e.removing = map[string]*plan.Peer{}
			}
			e.removing[id] = rec
		} else if rec, err = e.removeLocked(id); err == nil {
			// Recorded under the lock, so that an AddPeer of the id
			// after the removal is recorded after it too.
			e.traceRemovePeer(id, nil)
		}
	}
	e.cancels.mu.Unlock()
	switch {
	case err != nil:
		return err
	case !held:
		e.log.Debug("decode peer to remove is not held any more (removed, or added again with another pool)", zap.String("peer", id))
		return nil
	case marked:
		return nil
	case n > 0:
		e.log.Debug("decode peer to be removed once its last chunk ends; new chunks toward it are refused",
			zap.String("peer", id), zap.Int("live_chunks", n))
		return nil
	}
	e.forgetPeer(id, rec)
	return nil
}

// peerIdle is the registry's word that the last live chunk toward a
// watched peer ended: the removal RemovePeerWhenIdle deferred happens now.
// The mark names the record it was asked for; a removal of the peer
// meanwhile (RemovePeer) took the mark with it, so a record added since is
// never marked. It runs where the chunk's end was seen (the chunk's host,
// before the chunk answers its Finish or Drop; Register's goroutine for a
// chunk it did not hand over), and may wait for the registration lock,
// whose holders never wait on a chunk.
func (e *Engine) peerIdle(id string) {
	if !e.enter() {
		return
	}
	defer e.leave()
	e.cancels.mu.Lock()
	rec, marked := e.removing[id]
	var err error
	switch {
	case !marked:
	case e.env.Registry.WatchIdle(id) > 0:
		// Not reachable while the mark refuses registrations toward the
		// peer; should a chunk send to it anyway, the watch is armed again
		// and the removal waits for that chunk too.
		marked = false
	default:
		if _, err = e.removeLocked(id); err == nil {
			e.traceRemovePeer(id, nil)
		}
	}
	e.cancels.mu.Unlock()
	switch {
	case !marked:
	case err != nil:
		e.log.Warn("decode peer not removed after its last chunk ended", zap.String("peer", id), zap.Error(err))
	default:
		e.forgetPeer(id, rec)
	}
}

// removeLocked forgets a peer's record, its marks, the rooms its session
// cancelled and a pending removal; the caller holds cancels.mu for writing
// and has checked that no live chunk sends to the peer.
func (e *Engine) removeLocked(id string) (*plan.Peer, error) {
	rec, err := e.env.Peers.Remove(id)
	if err != nil {
		return nil, err
	}
	// The rooms the session cancelled go with it: a decode server that
	// restarts under the id is another session, whose room of the same id
	// is another request.
	e.cancels.forget(id)
	delete(e.removing, id)
	return rec, nil
}

// forgetPeer closes the submitters' endpoints to a removed peer.
func (e *Engine) forgetPeer(id string, rec *plan.Peer) {
	actors.ForgetPeer(e.env, id, rec)
	e.log.Debug("decode peer removed", zap.String("peer", id))
}

// removingError is why Register refuses a chunk toward a peer whose removal
// waits for its last chunk, or nil; the caller holds cancels.mu.
func (e *Engine) removingError(spec *ChunkSpec) error {
	if len(e.removing) == 0 {
		return nil
	}
	for _, in := range spec.Infos {
		if _, ok := e.removing[in.Peer]; ok && !in.Dummy {
			return errors.Mark(errors.Mark(errors.Newf("register room %d: decode peer %q is being removed (its session ended): nothing registered", spec.Room, in.Peer),
				ErrPeerLost), ErrEndpointBroken)
		}
	}
	return nil
}
