package core

import (
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/stderrs"
)

// The error classes the core marks its errors with; package decode
// re-exports them, and documents them for the serving stack.
var (
	ErrBadInput       = cp.ErrBadInput
	ErrChunkFailed    = errors.New("chunk failed")
	ErrPrefillLost    = errors.New("prefill lost")
	ErrSessionAborted = errors.New("session aborted")
	ErrNotQuiesced    = rdma.ErrNotQuiesced
	ErrClosed         = errors.New("closed")
	ErrCancelled      = errors.New("room cancelled")
)

// BadInput is an error of a caller's value: it names the value.
func BadInput(format string, args ...any) error {
	return errors.Mark(errors.Newf(format, args...), ErrBadInput)
}

// ClosedError is the error of a call after Close.
func ClosedError(call string) error {
	return errors.Mark(errors.Mark(errors.Newf("%s after Close", call), ErrClosed), ErrBadInput)
}

// public is how an exported function of this package returns its error,
// as package decode's do.
func public(err error) error { return stderrs.Public(err) }

// Clip returns s cut to at most n bytes, at a character boundary: a text
// a message carries must stay UTF-8, or protobuf refuses to marshal the
// string field and protoactor drops the whole message (a cancel, an
// answer, a verdict that never arrives).
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
