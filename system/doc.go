// Package system is kvstream's public façade: the Engine a serving stack
// embeds on its prefill side.
//
//	eng, err := system.New(cfg, system.WithStream(computeStream), system.WithTransport(tr))
//	err = eng.AddPeer(decodePeer)        // once per decode session (decode.Client.Attach calls it)
//	reg, err := eng.Register(ctx, chunk) // scheduler, before the forward; reg.Mode: how the room is sent
//	fw, err := eng.BeginForward()        // forward loop
//	err = fw.LayerEnd(l)                 // after each layer's KV write is enqueued
//	err = fw.End()                       // after the last kernel is enqueued
//	res, err := eng.Finish(ctx, room)    // transfer path: the front chunk's status, once its bytes landed
//	err = eng.Drop(ctx, room)            // abort: quiesce before pages are reused
//	err = eng.Close()
//
// A production engine records its events on the GPU's compute stream
// (WithStream, or WithGPU) and moves the KV over UCX (WithTransport);
// system.WithHardware(simulated.Hardware()) gives it a virtual GPU and the
// in-process loopback fabric instead (package system/simulated), for
// simulations, tests and examples. Example is the whole flow, runnable; a
// test compiles the outline above (doc_test.go), so that it stays the API's.
//
// The engine chooses per-layer streaming or the monolithic post-forward send
// per room (invariant 8 of docs/ARCHITECTURE.md, where the invariants and
// the vocabulary are) and says which. Finish and Drop return only when no
// write of the chunk can land any more, and always within the finish timeout.
//
// The decode side is package decode: a decode server's pool, and the
// session that gives this engine its Peer (decode.Client.Attach) and tells
// the decode side each chunk's outcome.
//
// A decode that stops (a rolling restart) says so first; Attach then calls
// PeerDraining, and the engine refuses a chunk that would open a new room
// toward it (Register's error is marked ErrDecodeDraining: register the
// request toward another decode) while its rooms in flight are sent and
// finished as before. A serving stack learns of it with one option,
// WithPeerDraining(func(peer, reason string)): its router sends new
// requests elsewhere from then on, and says Bye to that decode once its
// rooms there are done. Once a decode session ended (Bye said, or the peer
// lost and its rooms answered), RemovePeer forgets the peer and closes the
// endpoints to it; the id may be added again. RemovePeerWhenIdle does the
// same for a session that ended before its rooms there did: the peer goes
// the moment its last chunk ends, and until then no new chunk is sent to
// it (decode.Client's Bye and Close call it).
//
// A room is cancelled on either side's initiative: when the prefill gives
// a room up (its client aborted), Drop it, then tell the decode
// (decode.Client.Cancel, with Drop's error); Drop posts no further group
// of the room and returns once none of its writes can land. When the
// decode gives it up (decode.Server.Cancel), Attach calls CancelRoom with
// that decode's peer id and answers: a room with a live chunk toward that
// peer is dropped (a room sending only elsewhere is left alone), and from
// then on Register refuses the room's chunks toward it (ErrRoomCancelled),
// so that a later chunk of a chunked prefill never writes the pages the
// decode freed; the serving stack hears of it with
// WithRoomCancelled(func(peer string, room uint64, reason string)). Every error the engine returns
// answers errors.Is for its class (the Err* values) with the standard
// library's errors package as with cockroachdb's.
//
// The files: types.go names the values a caller passes and gets back,
// config.go and options.go configure New, engine.go is the lifecycle (New,
// Close), calls.go the calls of the scheduler and the transfer path
// (AddPeer, PeerLost, PeerDraining, RemovePeer, Register, Finish, Drop),
// removal.go RemovePeerWhenIdle and the removal it defers, forward.go the
// forward loop's hooks.
package system
