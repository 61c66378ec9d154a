package system

import (
	"context"
	"slices"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
)

// AddPeer adds a decode session. Without Peer.Sharding its buffers must
// match the prefill layout one for one (same item lengths). With it (and
// Config.Sharding), AddPeer computes what this prefill rank sends the peer
// (cp/reshard) and refuses a pairing that cannot reshard (ErrBadInput, naming
// the values: heads that do not split, other head dims, dtypes, layer counts
// or page sizes, MLA against MHA, bad stages or ranks) or buffers that do not
// match the peer's side. A peer this rank routes nothing to is added, and
// receives nothing, like a dummy destination.
func (e *Engine) AddPeer(p Peer) (err error) {
	defer func() { err = public(err) }()
	if !e.enter() {
		return closedError("AddPeer")
	}
	defer e.leave()
	rp, err := plan.ResolvePeer(e.layout, p)
	// Added and recorded under the registration lock, which removals hold
	// while they remove and record: a trace never has an id added again
	// before the removal that freed it.
	e.cancels.mu.RLock()
	if err == nil {
		err = e.traceable(&p)
	}
	if err == nil {
		err = e.env.Peers.Add(rp)
	}
	e.traceAddPeer(&p, err)
	e.cancels.mu.RUnlock()
	return err
}

// PeerLost tells the engine a decode peer is gone (its process died, the
// control plane lost it, its heartbeats stopped): work for it fails at once
// instead of waiting for transport errors or timeouts, new registrations to
// it are refused (ErrPeerLost, also ErrEndpointBroken), and the submitters
// close their endpoints to it, so that batches in flight there fail now and
// their chunks answer FAILED without waiting out the finish timeout. Those
// chunks still quiesce before they answer: closing an endpoint is a barrier
// (with UCX, a bounded drain; see ErrNotQuiesced).
func (e *Engine) PeerLost(id string, cause error) error {
	if !e.enter() {
		return public(closedError("PeerLost"))
	}
	defer e.leave()
	rec, err := e.env.Peers.Lose(id, cause)
	if err != nil {
		return public(err)
	}
	actors.PeerLost(e.env, id, rec)
	return nil
}

// RemovePeer forgets a decode peer whose session ended (the serving stack
// said Bye, or the peer was lost and its rooms answered): its record, its
// lost or draining mark, and the submitters' endpoints to it, so that a
// prefill that serves ever-new decode sessions keeps none of the ended
// ones. The id may be added again (a decode server that restarted). It is
// refused, changing nothing, while a live chunk (queued, being sent or
// finished) has a real destination on the peer: finish or drop those
// rooms first; until then a lost peer's mark still fails what is sent to
// it. An unknown peer, or one still in use, is ErrBadInput. A closed
// engine holds no peer any more: nil (decode.Client's Bye removes its peer,
// and a serving stack may close the engine first).
func (e *Engine) RemovePeer(id string) (err error) {
	defer func() { err = public(err) }()
	if !e.enter() {
		return nil
	}
	defer e.leave()
	// No registration is between its checks and its hand-off meanwhile
	// (Register holds the lock for reading from its check on): one that
	// found the peer is counted, one after finds it gone.
	e.cancels.mu.Lock()
	n := e.env.Registry.ToPeer(id)
	var rec *Peer
	if n == 0 {
		rec, err = e.removeLocked(id)
	} else {
		err = errors.Mark(errors.Newf("remove peer %q: %d live chunks send to it; finish or drop their rooms first (or RemovePeerWhenIdle)", id, n), ErrBadInput)
	}
	e.traceRemovePeer(id, err) // under the lock, as AddPeer's record
	e.cancels.mu.Unlock()
	if err != nil {
		return err
	}
	e.forgetPeer(id, rec)
	return nil
}

// PeerDraining tells the engine a decode peer drains (its server is
// stopping and said so: decode.Client.Attach calls it): from now on a
// chunk that opens a new room toward it (its first chunk: Start 0, no
// chunk of the room registered) is refused with ErrDecodeDraining, while
// the rooms in flight there are registered, sent and finished as before.
// The serving stack hears of it through WithPeerDraining, and says Bye to
// the decode once its rooms there are done. A second call changes nothing.
func (e *Engine) PeerDraining(id, reason string) error {
	if !e.enter() {
		return public(closedError("PeerDraining"))
	}
	defer e.leave()
	first, err := e.env.Peers.Drain(id, reason)
	if err != nil || !first {
		return public(err)
	}
	e.log.Debug("decode peer draining: new rooms toward it are refused", zap.String("peer", id), zap.String("reason", reason))
	for _, f := range e.onDraining {
		f(id, reason)
	}
	return nil
}

// Register registers the chunk that the next forward writes, before that
// forward begins. It is idempotent per (room, exact chunk range):
// registering an active chunk again changes nothing and is cheap. It returns
// the mode the room uses: per-layer when it has a real (non-dummy)
// destination and per-layer is on (with Config.SingleDestinationPerLayer,
// exactly one), else monolithic.
//
// An error means nothing changed. ctx is checked before the chunk is handed
// to the engine; once handed over, the registration completes (the manager
// answers at once) and Register returns its result whatever ctx does, so
// that a cancelled caller never leaves behind a chunk it was told failed.
func (e *Engine) Register(ctx context.Context, spec ChunkSpec) (reg Registration, err error) {
	defer func() { err = public(err) }()
	entered := e.enter()
	if entered {
		defer e.leave() // after the trace's record: Close dumps the trace
	}
	var slot trace.Slot
	var begun bool
	var built *plan.Plan
	defer func() { e.traceRegister(&spec, reg, err, slot, begun, built) }()
	if !entered {
		e.obs.Refused("closed")
		return Registration{}, closedError("Register")
	}
	// Held until the chunk is handed to the manager: a decode's cancel of
	// the room either is seen here or drops the chunk (CancelRoom).
	e.cancels.mu.RLock()
	locked := true
	unlock := func() {
		if locked {
			locked = false
			e.cancels.mu.RUnlock()
		}
	}
	defer unlock()
	if err := e.cancels.check(&spec); err != nil {
		e.obs.Refused("room_cancelled")
		return Registration{}, err
	}
	key := spec.Key(e.cfg.PageSize, e.nextForward.Load())
	if a, first, ok := e.env.Registry.Lookup(key); ok {
		if err := sameTransfer(first, &spec); err != nil {
			e.obs.Refused("bad_input")
			return Registration{}, err
		}
		return registration(a, 0), nil
	}
	if err := ctx.Err(); err != nil {
		e.obs.Refused("cancelled")
		return Registration{}, errors.Wrapf(err, "register room %d chunk %d: nothing registered", spec.Room, spec.Start)
	}
	if err := e.Healthy(); err != nil {
		e.obs.Refused("unhealthy")
		return Registration{}, err
	}
	for _, in := range spec.Infos {
		if lost := e.env.Peers.Lost(in.Peer); lost != nil && !in.Dummy {
			e.obs.Refused("peer_lost")
			return Registration{}, lost
		}
	}
	if err := e.removingError(&spec); err != nil {
		e.obs.Refused("peer_removed")
		return Registration{}, err
	}
	if spec.Start == 0 && !e.env.Registry.HasRoom(spec.Room) {
		for _, in := range spec.Infos {
			if d := e.env.Peers.Draining(in.Peer); d != nil && !in.Dummy {
				e.obs.Refused("peer_draining")
				return Registration{}, errors.Wrapf(d, "register room %d: nothing registered", spec.Room)
			}
		}
	}
	p, err := plan.BuildPlan(e.layout, e.env.Peers.Get, &spec, e.cfg.policy())
	if err == nil {
		err = e.traceableRegister(&spec)
	}
	if err != nil {
		e.obs.Refused("bad_input")
		return Registration{}, err
	}
	p.Chunk = messages.Chunk{ChunkKey: key, Serial: e.nextSerial.Add(1)}
	slot, begun = e.traceBeginRegister(&spec, p.Chunk)
	built = p
	job := actors.NewJob(p)
	reply := make(chan messages.Added, 1)
	peers := realPeers(&spec)
	e.env.Registry.Sending(p.Chunk, peers) // before the hand-off: RemovePeer counts it from now on
	e.system.Root.Send(e.manager, &messages.AddChunk{
		Chunk: p.Chunk, PerLayer: p.Mode == cp.PerLayer, Owned: p.Owned, Dests: len(p.Dests),
		Peers: peers, Start: actors.StartChunk(e.env, job), Reply: reply,
	})
	unlock()
	select {
	case a := <-reply:
		reg := registration(a, p.Reason)
		if a.Existing {
			job.Release()
			e.env.Registry.NotSent(p.Chunk)
			// A concurrent registration of the key won the race: check
			// against it as the fast path would have.
			if _, first, ok := e.env.Registry.Lookup(key); ok {
				if err := sameTransfer(first, &spec); err != nil {
					e.obs.Refused("bad_input")
					return Registration{}, err
				}
			}
		} else {
			e.env.Registry.Remember(a.Chunk, spec.CloneFor(built))
			e.obs.Registered(reg)
		}
		return reg, nil
	case <-time.After(finishGrace):
		return Registration{}, errors.AssertionFailedf("room %d chunk %d: the engine did not answer Register within %v (a bug)", spec.Room, spec.Start, finishGrace)
	}
}

// realPeers are the decode peers of the spec's real destinations.
func realPeers(spec *plan.ChunkSpec) []string {
	var out []string
	for _, in := range spec.Infos {
		if !in.Dummy && !slices.Contains(out, in.Peer) {
			out = append(out, in.Peer)
		}
	}
	return out
}

// sameTransfer checks a registration of an active chunk against the spec
// the chunk was registered with (nil until the first Register returned).
func sameTransfer(first any, spec *plan.ChunkSpec) error {
	if f, ok := first.(*plan.ChunkSpec); ok {
		return f.SameTransfer(spec)
	}
	return nil
}

func registration(a messages.Added, r Reason) Registration {
	m := Monolithic
	if a.PerLayer {
		m = PerLayer
	}
	return Registration{Mode: m, Reason: r, Existing: a.Existing, Chunk: a.Chunk}
}

// timeout is how long Finish or Drop may take: the finish timeout, or less
// when ctx has an earlier deadline (but at least a millisecond, so that an
// expired ctx still fails the chunk through its own path).
func (e *Engine) timeout(ctx context.Context) time.Duration {
	timeout := e.cfg.FinishTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(dl), time.Millisecond))
	}
	return timeout
}

// finishGrace bounds how long Finish, Drop and a decode peer's cancel wait
// past the chunk's own deadline for its answer. The chunk answers at its
// deadline once its teardown ended, which closes its endpoints: a close the
// transport lets take longer (a UCX close that drains toward a stalled
// peer), or a bug, outlasts this margin, and the call fails with
// unanswered's error instead of hanging.
const finishGrace = 5 * time.Second

// unanswered is the error of a call on room the engine did not answer
// within bound: the chunk's teardown is still under way (or a bug kept the
// answer), so its writes may still land. It is marked ErrNotQuiesced, so
// that the caller keeps the room's decode pages out of other rooms, and
// ErrTimeout.
func unanswered(call string, room uint64, bound time.Duration) error {
	return errors.Mark(errors.Mark(errors.Newf("room %d: the engine did not answer %s within %v: the chunk's teardown is still under way (or a bug kept its answer), and its writes may still land", room, call, bound), ErrNotQuiesced), ErrTimeout)
}

// Finish waits for the room's front chunk (chunks finish in send order) and
// returns its result. It returns within the finish timeout (or ctx's
// deadline, if sooner), and only when no write of the chunk can land any
// more; if the chunk's teardown outlasts that by 5 s (a transport whose
// endpoint close drains longer), Finish returns then, with status Failed
// and an error marked ErrNotQuiesced and ErrTimeout: the chunk's writes may
// still land, so its decode pages must not be reused. A failed chunk returns its result and an error marked with its
// class (ErrTimeout, ErrEndpointBroken, ErrEventWait, ErrDeviceLost); a
// chunk dropped while Finish waited returns status Dropped and ErrDropped; a
// room with no chunk to finish (unknown, or all finished or dropped) returns
// ErrNoChunk, also ErrBadInput. If ctx is cancelled the
// chunk fails (and still quiesces before Finish returns); if it was done
// already when Finish was called, the chunk fails at once and posts nothing
// more (what it posted before still lands or is torn down first).
func (e *Engine) Finish(ctx context.Context, room uint64) (Result, error) {
	if !e.enter() {
		err := public(closedError("Finish"))
		// Failed, not the zero Status (Succeeded): a caller that builds its
		// notice from the result whatever the error must not say success.
		return Result{Status: Failed, Err: err}, err
	}
	defer e.leave()
	timeout := e.timeout(ctx)
	call := time.Now()
	ev, evErr := e.stream.Record()
	reply := make(chan Result, 1)
	e.system.Root.Send(e.manager, &messages.Finish{Room: room, Timeout: timeout, Ctx: ctx, Abandoned: ctx.Err(), Event: ev, EventErr: evErr, Reply: reply})
	select {
	case r := <-reply:
		if r.Chunk.Serial != 0 { // a chunk answered (not an unknown room)
			ret := time.Now()
			ph, ok := e.exposure(&r, ret)
			e.obs.Finished(FinishRecord{Result: r, Latency: ret.Sub(call), Exposed: r.Stats.Exposed, Phases: ph, HasPhases: ok, Returned: ret})
		}
		r.Err = public(r.Err)
		return r, r.Err
	case <-time.After(timeout + e.grace):
		err := public(unanswered("Finish", room, timeout+e.grace))
		return Result{Status: Failed, Err: err}, err
	}
}

// Drop aborts every chunk of the room, queued or being finished (abort or
// failure on the serving side): a Finish waiting on one of them answers
// Dropped. It returns when none of their writes can land any more, so their
// decode pages may be reused; within the finish timeout. Dropping a room
// with no chunk (unknown, or all finished or dropped) is ErrNoChunk, also
// ErrBadInput. An error marked
// ErrNotQuiesced says a chunk's teardown could not stop its writes, or
// had not within the finish timeout and 5 s more (see Finish): those
// pages must not be reused.
func (e *Engine) Drop(ctx context.Context, room uint64) error {
	if !e.enter() {
		return public(closedError("Drop"))
	}
	defer e.leave()
	return public(e.drop(ctx, room))
}

func (e *Engine) drop(ctx context.Context, room uint64) error {
	timeout := e.timeout(ctx)
	reply := make(chan []Result, 1)
	e.system.Root.Send(e.manager, &messages.Drop{Room: room, Timeout: timeout, Reply: reply})
	select {
	case rs := <-reply:
		return dropResult(rs)
	case <-time.After(timeout + e.grace):
		return unanswered("Drop", room, timeout+e.grace)
	}
}

// HasRoom reports whether the room has a live chunk context.
func (e *Engine) HasRoom(room uint64) bool { return e.env.Registry.HasRoom(room) }

// dropResult is a Drop's answer as its caller hears it: the manager's
// error for a room with no chunk (ErrNoChunk), else a teardown that could
// not quiesce (ErrNotQuiesced: those pages must not be reused), else nil (a
// dropped chunk fails by design).
func dropResult(rs []Result) error {
	if len(rs) == 1 && rs[0].Chunk.Serial == 0 && rs[0].Err != nil {
		return rs[0].Err
	}
	var err error
	for _, r := range rs {
		if errors.Is(r.Err, ErrNotQuiesced) {
			err = errors.CombineErrors(err, r.Err)
		}
	}
	return err
}
