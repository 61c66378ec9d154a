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
// the decode side each chunk's outcome. Every error the engine returns
// answers errors.Is for its class (the Err* values) with the standard
// library's errors package as with cockroachdb's.
//
// The files: types.go names the values a caller passes and gets back,
// config.go and options.go configure New, engine.go is the lifecycle (New,
// Close), calls.go the calls of the scheduler and the transfer path
// (AddPeer, Register, Finish, Drop), forward.go the forward loop's hooks.
package system
