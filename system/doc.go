// Package system is kvstream's public façade: the Engine a serving stack
// embeds on its prefill side.
//
//	eng, err := system.New(cfg, system.WithStream(computeStream), system.WithTransport(tr))
//	eng.AddPeer(decodePeer)                      // once per decode session
//	mode, err := eng.Register(ctx, chunk)         // scheduler, before the forward
//	fw, err := eng.BeginForward()                 // forward loop
//	fw.LayerEnd(l)                                // after each layer's KV write is enqueued
//	fw.End()                                      // after the last kernel is enqueued
//	res, err := eng.Finish(ctx, room)             // transfer path: front chunk's status
//	eng.Drop(ctx, room)                           // abort: quiesce before pages are reused
//	eng.Close()
//
// The engine chooses per-layer streaming or the monolithic post-forward send
// per room (invariant 8 of docs/ARCHITECTURE.md, where the invariants and
// the vocabulary are) and says which. Finish and Drop return only when no
// write of the chunk can land any more, and always within the finish timeout.
//
// The decode side is package decode: a decode server's pool, and the
// session that gives this engine its Peer (decode.Client.Attach) and tells
// the decode side each chunk's outcome. Every error the engine returns
// answers errors.Is for its class (the Err* values) with the standard
// library's errors package as with cockroachdb's.
//
// The files: types.go names the values a caller passes and gets back,
// config.go and options.go configure New, engine.go is the lifecycle (New,
// Close), calls.go the calls of the scheduler and the transfer path
// (AddPeer, Register, Finish, Drop), forward.go the forward loop's hooks.
package system
