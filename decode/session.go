package decode

import (
	"context"
	"maps"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode/internal/core"
)

// Session is one prefill's session with a Server, from its Hello to its
// Bye (or its loss), as the serving stack sees it.
type Session struct {
	info core.SessionInfo
	// heartbeat watches the prefill's node; the server's actor owns it.
	heartbeat *heartbeat

	done   chan struct{}
	report SessionReport // written before done is closed
	err    error
}

// Prefill is the prefill's name, as its Hello gave it.
func (s *Session) Prefill() string { return s.info.Prefill }

// Identity is the prefill's certificate name (in the clear, its name): the
// identity ExpectFrom names.
func (s *Session) Identity() string { return s.info.Identity }

// Rank is the session's CP rank when the server serves a group
// (Config.Group), else 0.
func (s *Session) Rank() int { return s.info.Rank }

// Metadata is what the prefill passed in DialConfig.Metadata (opaque to
// kvstream).
func (s *Session) Metadata() map[string]string { return maps.Clone(s.info.Metadata) }

// Wait returns the session's report once it ended: after the prefill's Bye
// (answered once its access to the pool was revoked) and its leaving (or
// Config.ByeGrace), or after its loss and the revocation of its access. The error says why the session is not complete:
// ErrSessionAborted, ErrChunkFailed, ErrPrefillLost, ErrClosed; or ctx's
// error. A session that reported nothing (SessionReport.Empty) has no
// error and is not complete.
func (s *Session) Wait(ctx context.Context) (SessionReport, error) {
	select {
	case <-s.done:
	case <-ctx.Done():
		return SessionReport{}, public(errors.Wrapf(ctx.Err(), "wait for the session of %s", s.info.Prefill))
	}
	return s.report, s.err
}

// ended says whether the session ended (finish ran).
func (s *Session) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// finish reports the session's end, once (the server's actor calls it).
func (s *Session) finish(r SessionReport, err error) {
	s.report, s.err = r, err
	close(s.done)
}
