package decode

import (
	"context"
	"maps"
	"sync"

	"github.com/cockroachdb/errors"
)

// Session is one prefill's session with a Server, from its Hello to its
// Bye (or its loss).
type Session struct {
	token    string
	prefill  string
	peer     string // the prefill's certificate name; "" in the clear
	addr     string // the prefill node's address: every message must come from it
	watch    string // the prefill session actor's PID, watched for its loss
	metadata map[string]string
	rank     int // its CP rank when the server serves a group
	// heartbeat watches the prefill's node; guarded by the Server's mu.
	heartbeat *heartbeat

	mu       sync.Mutex
	report   SessionReport
	notices  int // accepted or not, as the prefill counts them
	bye      bool
	err      error
	done     chan struct{}
	finished bool
}

// Prefill is the prefill's name, as its Hello gave it.
func (s *Session) Prefill() string { return s.prefill }

// Rank is the session's CP rank when the server serves a group
// (Config.Group), else 0.
func (s *Session) Rank() int { return s.rank }

// Metadata is what the prefill passed in DialConfig.Metadata (opaque to
// kvstream).
func (s *Session) Metadata() map[string]string { return maps.Clone(s.metadata) }

// Wait returns the session's report once it ended: after the prefill's Bye
// and its leaving (or Config.ByeGrace), or its loss. The error says why the
// session is not complete: ErrSessionAborted, ErrChunkFailed,
// ErrPrefillLost, ErrClosed; or ctx's error.
func (s *Session) Wait(ctx context.Context) (SessionReport, error) {
	select {
	case <-s.done:
	case <-ctx.Done():
		return SessionReport{}, public(errors.Wrapf(ctx.Err(), "wait for the session of %s", s.prefill))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.report, public(s.err)
}

// end ends the session with err (nil: complete), once.
func (s *Session) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished {
		return
	}
	s.finished = true
	if s.err == nil {
		s.err = err
	}
	s.report.Complete = s.err == nil
	close(s.done)
}
