// Package tracetest mutates recorded traces, for the tests that show a
// replay is not vacuous: every edit of a trace (a record deleted,
// duplicated, moved or renumbered, a field of each kind of record
// changed) must be a divergence that names the edited record, or be
// listed by the test as a change no replay can notice, with the reason.
// The engine's trace tests (package tests) and the decode server's
// (package decode) use it.
package tracetest
