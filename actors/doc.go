// Package actors holds the engine's actors, each a thin shell around a
// functional core:
//
//   - ForwardCore (forward actor, synchronized dispatcher: runs on the forward
//     loop's goroutine): binds registered chunks to the next forward and fans
//     a group boundary out to that forward's chunks;
//   - RoomCore (one room actor per room): the FIFO of chunk contexts, finish
//     pops the front, drop drains all;
//   - ChunkCore (one chunk actor per chunk context): dedups groups, counts
//     enqueued/processed work and posted/completed batches, sends what no
//     group covered, answers finish once everything landed, fails closed;
//   - ManagerCore (the root): routes by room and stops idle rooms safely;
//   - submitters (a supervised pool behind a protoactor round-robin group
//     router): wait a group's event, build its blocks, post one batch.
//
// A core takes a message and returns effects; it has no goroutines, no clocks
// and no hardware, so every behaviour can be tested by feeding messages and
// traces can be replayed. Shells only deliver messages and perform effects.
package actors
