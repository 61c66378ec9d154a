// Package soak runs a decode process as a service for a bounded time
// against a mix of legitimate prefills and faults, watches what the process
// holds (resident memory, open files, goroutines), and reports
// (`kvstream soak` is its command line; Config's errors name its flags).
//
// The decode is a child process (kvstream decode, Config.Command), run with
// --verbose so that its log names every session it opens; its stdout names
// every session's end. Two lanes run against it at once:
//
//   - the main lane: one kvstream prefill process at a time (every one
//     writes rooms 0..N-1 into overlapping decode pages, so two cannot share
//     the decode), run to its end (clean), killed at a random instant
//     (kill), stopped until the decode declared it lost and then resumed or
//     killed (stop), or running while the decode is stopped for longer than
//     the prefill's heartbeat bound (pause-decode). An episode ends only once
//     the decode ended every session of it;
//   - the side lane, sessions that report no room: a process that says Hello
//     and is killed (vanish), a Hello the decode must refuse (refused), and
//     an in-process writer (bye-writer) that writes into the pool over the
//     transport (Config.Open), says Bye, and goes on writing: none of those
//     later writes may complete.
//
// The first main-lane episode is a clean warm-up: the first session
// allocates a pool and lazy structures, so the "start" figures are taken
// after it, once the decode ended every session and Config.Settle passed;
// the "end" figures the same way after the last episode. Growth between
// them beyond Config.Bounds fails the report, as do a decode crash, a
// legitimate session that failed or whose bytes differ, a bye-writer write
// that completed after its Bye returned, and a fault the processes did not
// answer as they must (Report.Failures says which).
package soak
