package cp

import "github.com/cockroachdb/errors"

// ErrBadInput marks every error this package returns: the caller passed a
// value that cannot describe a transfer. Callers branch on it with errors.Is.
var ErrBadInput = errors.New("bad input")

func badInput(format string, args ...any) error {
	return errors.Mark(errors.Newf(format, args...), ErrBadInput)
}
