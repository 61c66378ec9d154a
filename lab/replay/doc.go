// Package replay re-runs a recorded message trace.
//
// Cores replays it through the engine's functional cores, with no
// goroutine, clock or hardware: every message that came from outside the
// actors (façade calls, hardware completions, timers) is fed from the
// trace; every message an actor sent another is produced by the replayed
// cores and must match, in content, the message the recording shows the
// receiver handling; and every core's effects must equal the recorded ones.
// The first mismatch is reported with both sides. Dropping a recorded
// LayerEnd, duplicating a GroupReady or reordering the calls that change
// what cores decide shows up as a divergence.
//
// A decode server's trace (package decode records one; its header's side
// is "decode") is replayed through a fresh decode core instead
// (DecodeCore, which Cores calls for such a trace): decode.Replay feeds it
// every recorded message and checks every effect and that the trace
// accounts for every message (a Call's result right after the Call, one
// outcome per revocation, a timer at most once after it was armed).
//
// Engine replays the trace's façade calls through a real engine on the
// simulated GPU and loopback transport and compares the final chunk
// statuses with the recorded ones, and every successful chunk's
// destination bytes with the model's.
//
// The package sits at the top of the stack, beside the CLI (`kvstream
// replay`) and the cross-package tests that use it: it imports actors,
// system and the test bed, while the trace format and recorder it reads
// (package trace) stay below actors. It is internal because it depends on
// lab/testbed's fixtures.
package replay
