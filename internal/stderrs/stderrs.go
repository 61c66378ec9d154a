package stderrs

import (
	"fmt"

	"github.com/cockroachdb/errors"
	"go.uber.org/zap"
)

// public wraps an error whose classes are cockroachdb marks. The standard
// library's errors.Is follows Unwrap and Is methods only, and a mark is
// neither; Is here asks cockroachdb, which sees the marks.
type public struct{ cause error }

// Public returns err with an Is method that answers as cockroachdb's
// errors.Is does, or nil for nil. Wrapping twice is a no-op.
func Public(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*public); ok {
		return err
	}
	return &public{cause: err}
}

func (e *public) Error() string { return e.cause.Error() }

// Unwrap keeps the cause reachable to both packages (As, Cause, details).
func (e *public) Unwrap() error { return e.cause }

// Is delegates to cockroachdb's errors.Is on the cause, which compares
// marks as well as the chain (and calls Is methods, so no loop: the cause is
// never this wrapper).
func (e *public) Is(target error) bool { return errors.Is(e.cause, target) }

// Format prints the cause as cockroachdb does (%+v gives its details).
func (e *public) Format(s fmt.State, verb rune) { errors.FormatError(e, s, verb) }

// SafeFormatError prints nothing of its own: the wrapper is invisible in
// cockroachdb's formatting and redaction.
func (e *public) SafeFormatError(errors.Printer) error { return e.cause }

// WarnField is an error for a WARN line: its message only. zap.Error of a
// cockroachdb error adds its whole cause chain with a stack trace
// ("errorVerbose", about 2 KB a line), which an operator's log of an
// expected event (a broken connection, a lost peer) does not need; DEBUG
// lines keep zap.Error.
func WarnField(err error) zap.Field {
	if err == nil {
		return zap.Skip()
	}
	return zap.String("error", err.Error())
}
