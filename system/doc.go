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
// per room (docs/ARCHITECTURE.md, invariant 8) and says which. Finish and Drop return only
// when no write of the chunk can land any more, and always within the finish
// timeout.
package system
