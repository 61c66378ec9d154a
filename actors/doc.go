// Package actors holds the engine's actors, each a thin shell around a
// functional core:
//
//   - ForwardCore (forward actor, synchronized dispatcher: runs on the forward
//     loop's goroutine): binds registered chunks to the next forward and fans
//     a group boundary out to that forward's chunks (one queue entry per
//     chunk host: fanout.go);
//   - RoomCore (one hosted room per room: a process the manager spawns and
//     stops like an actor, whose messages a host steps, host.go): the FIFO
//     of chunk contexts, finish pops the front, drop drains all;
//   - ChunkCore (one hosted chunk per chunk context, started under its
//     room): dedups groups, counts enqueued/processed work and
//     posted/completed batches, sends what no group covered, answers finish
//     once everything landed, fails closed, resumes a broken or overdue
//     batch;
//   - ManagerCore (the root): routes by room and stops idle rooms safely;
//   - SubmitCore (one per Work, in a submitter of a supervised pool behind a
//     protoactor round-robin group router): after the group's event wait,
//     decides between posting, skipping, failing, retrying once, restarting
//     the submitter and escalating a lost device; the submitter builds the
//     blocks and posts one batch.
//
// Every effect is declared in effects.go, under the core that emits it.
//
// A core takes a message and returns effects; it has no goroutines, no clocks
// and no hardware, so every behaviour can be tested by feeding messages and
// traces can be replayed. Shells only deliver messages and perform effects.
package actors
