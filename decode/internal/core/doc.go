// Package core is the decode side's functional core: what package
// decode's Server decides, as plain types that take messages (Msg) and
// return effects (Effect), with no I/O, no lock and no clock. The Server's
// actor delivers the messages and performs the effects, in order, at one
// point. An effect whose name starts with Call asks the shell for a fact
// the core cannot compute (the serving stack's verdict, a registration,
// the bytes of a chunk): the shell performs it and steps the core at once
// with its result (the message named in the effect's comment), before it
// takes the next message from its mailbox.
//
// Its state, by concern:
//
//   - the page ledger (ledger.go): the pool's geometry, the room holding
//     each page, the released rooms whose pages are not yet quiet, and
//     the pages kept out for good;
//   - the session table (sessions.go): sessions by token, by identity and
//     by session actor, and a group's ranks lost and not back;
//   - the rooms (room.go, rooms.go), each decided by a GroupRoom
//     (group.go): a CP group's, or a group of one.
//
// Its handlers, by message family: the Hello and its Calls (hello.go,
// admit.go); notices and Verify (notice.go, verify.go); the goodbye, a
// loss, a revocation and timers (bye.go, loss.go, revoke.go, timer.go);
// the serving stack's calls per room (expect.go: Expect, Release,
// Lookup); and on the whole server (lifecycle.go: Drain, Close, State).
//
// Each rule is a file of testdata, run by TestCoreDataDriven
// (testdata/README.md); FuzzCore checks the invariants after every message
// of random sequences.
package core
