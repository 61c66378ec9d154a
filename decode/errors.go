package decode

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode/internal/core"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/stderrs"
)

// Error classes a caller branches on with errors.Is (the standard library's
// or cockroachdb's: every error this package returns answers both).
var (
	// ErrBadInput: a value passed in, or a value a peer sent, cannot be
	// served (pages out of range, an unknown room, a buffer geometry that
	// does not match the pool). The error names the value; nothing changed.
	// It is the prefill engine's ErrBadInput (system.ErrBadInput), so one
	// check covers both packages.
	ErrBadInput = cp.ErrBadInput
	// ErrVersion: the peer speaks another version of the control protocol
	// (package messages/wire). Also marked ErrBadInput.
	ErrVersion = errors.New("control protocol version mismatch")
	// ErrChunkFailed: the prefill reported a chunk of the room not
	// successful (FAILED or DROPPED), or a notice for the room was refused,
	// or Config.Verify rejected the room's bytes. Do not decode the room.
	// The prefill sends a failed chunk's notice only after its writes
	// stopped (its Finish or Drop quiesced), so the pages may be reused
	// unless the error is also marked ErrNotQuiesced.
	ErrChunkFailed = core.ErrChunkFailed
	// ErrPrefillLost: the prefill's process or connection went away before
	// the room completed. Also marked ErrNotQuiesced: writes it posted may
	// still be in flight.
	ErrPrefillLost = core.ErrPrefillLost
	// ErrDecodeLost: (prefill side) the decode server went away.
	ErrDecodeLost = errors.New("decode server lost")
	// ErrSessionAborted: the prefill ended its session (Bye) before the room
	// completed, or said it stopped early: the session is not complete.
	ErrSessionAborted = core.ErrSessionAborted
	// ErrNotQuiesced: writes into the room's pages may still land; do not
	// reuse those pages for another room. It is the prefill engine's
	// (system.ErrNotQuiesced) and the transport's (rdma.ErrNotQuiesced).
	ErrNotQuiesced = rdma.ErrNotQuiesced
	// ErrClosed: the server, client or node was closed. Also marked
	// ErrBadInput when a call came after Close.
	ErrClosed = core.ErrClosed
	// ErrRefused: the decode server refused a message: not a prefill it
	// serves, not the sender's session, the session already ended, a room
	// of another prefill.
	ErrRefused = errors.New("refused")
	// ErrUnreachable: (prefill side) nothing listens at the decode
	// server's address, or it did not answer in time: it may not be up
	// yet (DialConfig.ConnectTimeout retries). A Notify that gets it from a
	// live session was not refused: the server may still act on the
	// notice, and its answer to Bye counts it.
	ErrUnreachable = errors.New("unreachable")
	// ErrAuthentication: (prefill side) the two nodes cannot authenticate
	// each other: TLS on one side only, a certificate of another CA or
	// one the peer refused, or a decode certificate without
	// DialConfig.DecodeName. Retrying will not help.
	ErrAuthentication = errors.New("authentication failed")
	// ErrCancelled: the room was cancelled, by the decode side
	// (Server.Cancel) or by the prefill (Client.Cancel): do not decode
	// it. Its pages go back to the pool once no write of it can land.
	ErrCancelled = core.ErrCancelled
	// ErrUnavailable: the decode server cannot take the session now
	// (draining, closing, at its session bound, or this prefill's identity
	// still holds a live session): retry later.
	ErrUnavailable = errors.New("unavailable")
)

// badInput is an error of a caller's value: it names the value.
func badInput(format string, args ...any) error { return core.BadInput(format, args...) }

// public is how every exported function returns its error.
func public(err error) error { return stderrs.Public(err) }

// closedError is the error of a call after Close.
func closedError(call string) error { return core.ClosedError(call) }
