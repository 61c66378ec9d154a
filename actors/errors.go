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
