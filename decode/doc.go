// Package decode is kvstream's decode side, and the prefill's session with
// it: a serving stack embeds a Server next to its decode pool, and each
// prefill engine opens a session with it through a Client. The KV moves over
// the transport (RDMA/UCX: the prefill writes straight into the decode
// pool); this package is the control plane beside it (protoactor-go remote,
// the versioned protobuf messages of messages/wire).
//
// The snippets below are compiled by this package's tests (doc_test.go);
// Example runs both sides in one process, and ExampleServer_Wait shows a
// room that must not be decoded.
//
// # Decode side
//
//	tlsm, err := netsec.LoadTLS(netsec.Files{CA: ca, Cert: cert, Key: key})
//	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "10.0.0.2:9100", TLS: tlsm, Log: log}) // one per process
//	srv, err := decode.New(node, transport, decode.Config{Buffers: pool}) // registers the pool
//	// Per request: allocate decode pages, publish them to the prefill's
//	// scheduler (its DecodeInfo.DstPages), then:
//	err = srv.Expect(room, pages)
//	r, err := srv.Wait(ctx, room) // the chunks the prefill reported, once their bytes landed
//	// err == nil: every chunk succeeded, the last one included: decode r's pages.
//	err = srv.Release(room) // when the pages are free again
//
// Wait never reports a room complete unless the prefill reported its last
// chunk successful, after its Finish returned (every byte landed), with every
// earlier chunk successful. Otherwise it says why, by class (errors.Is, with
// the standard library's errors package or cockroachdb's):
//
//   - ErrChunkFailed: the prefill reported a chunk FAILED or DROPPED, or
//     named pages that are not the room's, or Config.Verify rejected it;
//   - ErrSessionAborted: the prefill said goodbye before the room's last
//     chunk (a prefill that stopped early is never reported complete);
//   - ErrPrefillLost: the prefill's process or connection went away;
//   - ErrNotQuiesced (with one of the above): writes may still land in the
//     room's pages; do not hand them to another room. A failed chunk's
//     notice comes after the prefill's Finish or Drop stopped its writes,
//     so without this mark the pages are quiet;
//   - ErrClosed, or the context's error.
//
// # Prefill side
//
//	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "10.0.0.1:0", TLS: tlsm, Log: log})
//	c, err := decode.Dial(ctx, node, decode.DialConfig{Decode: "10.0.0.2:9100", Buffers: cfg.Buffers, PageSize: cfg.PageSize})
//	err = c.Attach(eng) // Engine.AddPeer; PeerLost, PeerDraining and CancelRoom when the decode server goes, drains or cancels a room
//	// per chunk, after eng.Finish(ctx, room) returned res for the chunk registered as spec:
//	n, err := c.NoticeFor(spec, res) // the absolute positions sent, their decode pages
//	err = c.Notify(ctx, n)
//	// at the end, after eng.Close (nothing writes any more):
//	sum, err := c.Bye(ctx, nil) // or the reason the prefill stopped early
//
// # Drain and cancel
//
// A draining Server (Drain: SIGTERM in the commands) takes no new session
// and tells every open one (a Drain message): the Client calls its OnDrain
// functions, and Attach tells the engine (system.Engine.PeerDraining), which
// refuses new rooms toward it (system.ErrDecodeDraining) while the rooms in
// flight finish; the prefill then says Bye, and Drain returns as soon as its
// sessions ended. Server.Cancel gives a room up: the room fails
// (ErrCancelled) and is released, every session that may write it is told,
// its Client cancels the room in the engine toward this decode (Attach:
// system.Engine.CancelRoom drops a room sending here and refuses its later
// chunks) and answers with Cancel, saying the writes stopped only when
// CancelRoom returned nil, and Server.Cancel returns then, the pages back
// in the pool: within one group's transfer and a round trip. It waits for
// the room it cancelled, not for a later room of the same id. When one
// session (a rank of a group) cancels a room, or a rank's failed chunk or
// loss fails it, its pages also wait for the other sessions that still
// owe it (each until it reports a chunk that ends its writes, cancels the
// room, or its access is revoked). The prefill cancels a
// room itself with the engine's Drop, then Client.Cancel. A room has one
// outcome whichever side comes first.
//
// # A context-parallel group
//
// With Config.Group, the Server takes one session per rank of a CP group
// at once (each Dial names its rank in DialConfig.Metadata[RankKey]), and
// a room is the group's: for each of its chunks, the ranks owning at least
// one of the chunk's pages (cp's owner rule) must each report it
// successful with exactly those pages, and the chunks must tile the
// request to its last one, before Wait reports it complete. A report from
// a rank that owns none of the chunk's pages, a failed report, a rank
// whose session is lost while the room may still need it, or
// Config.RoomTimeout fails it.
//
// # Several pools in one process
//
// A process should run one Node; the decode ranks it hosts (TP ranks, PP
// stages, each its own pool) are one Server each on that node, told apart
// by Config.Name, and a prefill names the one it opens a session with in
// DialConfig.Server. What the two sides must agree on beyond the layout (a
// model, a resharding pairing) travels in DialConfig.Metadata, and
// Config.Admit refuses a Hello that disagrees before anything is sized.
//
// # Protocol
//
// Hello (the prefill's layout and protocol version) is answered by an Offer
// (the pool's regions, keys and transport address, and a session token)
// or a refusal with a code: VERSION when the versions differ (Dial's error
// is marked ErrVersion), BAD_INPUT when the layout does not match the pool
// (ErrBadInput, naming the buffer). A Hello its session actor repeats
// before the session sent anything (Dial's retry when the first answer came
// after its call timeout) gets the same Offer. Every ChunkNotice carries the session
// token and must come from the node that said Hello; it is checked against
// the pool and the room before it changes anything. Bye carries how many
// notices the prefill sent and whether it stopped early; its answer is the
// decode side's verdict, sent once the session's access to the pool is
// revoked (nothing the prefill posts afterwards lands). Each side watches the other's session actor, so a
// vanished peer is reported (ErrPrefillLost, ErrDecodeLost). On the decode
// side that report is a suspicion (anyone holding the prefill's
// certificate can forge one, and a connection that broke and came back
// sends one): the session goes on while its node answers heartbeats; with
// Config.DepartedGrace set, one that says nothing more (a Dial that gave
// up on its Hello, a Client closed without Bye) ends as lost, its access
// revoked first, once the grace passed. Drain (decode
// to prefill) and Cancel (either way) carry the session token too; version
// 3 added them, and a peer of version 2 is refused at Hello.
//
// # Security
//
// Every node runs package netsec's guards (recovered panics, unimplemented
// methods answered with an error, message batches checked before protoactor
// reads them, size and stream limits) and accepts peers' messages only for
// the actors of a session. Off loopback a node needs TLS (NodeConfig.TLS):
// peers then hold certificates of the deployment's CA, and a session is
// bound to its peer's certificate name (the decode side at Hello, before it
// offers its worker address and keys; the prefill side to
// DialConfig.DecodeName before it says Hello). Each session watches the
// other node's heartbeats (NodeConfig.Heartbeat), so a hung peer is lost
// within a bound. docs/SECURITY.md has the threat model.
//
// # Message traces
//
// To investigate a deployment, a Server records a message trace: with
// Config.TracePath (or Config.Trace, or the environment variable the
// prefill engine reads too, KVSTREAM_TRACE=path, which writes path.decode)
// it keeps every message its core takes, with the effects the core
// returned, in a bounded ring written at Close (DumpTrace writes it any
// time). Replay (what kvstream replay runs for such a trace) feeds the
// messages to a fresh core and reports the first record whose effects
// differ, or that the trace does not account for (docs/TRACES.md, "Decode
// traces"). Without tracing the Server records nothing.
//
// Close methods take a context; every wait in this package is bounded by
// one, also while the Server's actor runs a slow Config callback (Admit,
// Size, Verify): a call it has not taken when its ctx ends returns ctx's
// error (Close's, Drain's: taken once the actor is free; Wait's, Cancel's:
// never run, nothing changed).
package decode
