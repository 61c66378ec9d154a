// Package trace records what the engine's actors handle and reads it back.
//
// A trace is JSON lines: a versioned header (engine version, configuration,
// the pool layout), then one record per message an engine actor handled:
// sequence number, monotonic time, actor kind and id, message type and
// fields, and the effects the actor's functional core returned for it.
// Recording is a protoactor receiver middleware (plus explicit hooks for
// ReenterAfter continuations and façade calls, which middleware does not
// see) writing into a bounded in-memory ring, so a long run cannot fill a
// disk; the ring is written out on demand and when the engine closes. When
// tracing is off the middleware is not installed at all: no cost.
//
// A decode server (package decode) records its own traces through the same
// recorder and format: its header says so (Header.Side, SideDecode) and
// carries the rules its core ran under (DecodeConfig) instead of an
// engine's configuration; its records are the messages its core took,
// encoded by package decode, with the effects the core returned.
//
// A trace is read as a stream (NewReader, then Next): one line at a
// time, each within a bound derived from the header's geometry, the header
// validated against explicit bounds (Header.Validate) and every record
// against the header (Header.CheckRecord) before a replay sizes anything
// from it; docs/TRACES.md lists the bounds.
//
// Replaying a trace (package lab/replay, above the engine: it drives
// the cores and a whole engine, so it cannot live below actors as this
// package does) feeds its external inputs to fresh functional cores and
// checks that every internal message and every effect matches the
// recording.
package trace
