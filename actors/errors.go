package actors

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/plan"
)

// ErrBadInput marks errors caused by a caller's value (plan.ErrBadInput,
// itself cp.ErrBadInput: one class from the pure functions up).
var ErrBadInput = plan.ErrBadInput

func badInput(format string, args ...any) error {
	return errors.Mark(errors.Newf(format, args...), ErrBadInput)
}

// ErrNoChunk marks a Finish or Drop of a room that has no chunk to finish or
// drop: never registered, or every chunk already finished or dropped. It is
// also ErrBadInput. The same error answers both cases, whatever the timing
// (a room whose last chunk ended may or may not have been stopped yet).
var ErrNoChunk = errors.New("no chunk")

// ErrDropped marks the result of a Finish whose chunk was dropped while the
// Finish waited: its status is DROPPED, never SUCCESS.
var ErrDropped = errors.New("dropped")

func noChunk(room uint64, call string) error {
	return errors.Mark(errors.Mark(errors.Newf("room %d: no chunk to %s (never registered, or every chunk already finished or dropped)", room, call), ErrNoChunk), ErrBadInput)
}
