package simsession

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
)

// ServeConfig says how long a decode process serves.
type ServeConfig struct {
	// Runs, if positive, stops the process once that many prefill runs
	// ended: non-empty sessions with its first decode rank (a sharded
	// prefill opens one per rank). Zero serves until ctx ends. A refused
	// Hello or an empty session (a Hello and a goodbye) is no run.
	Runs int
	// DrainTimeout bounds the drain once the process stops taking
	// sessions: sessions still open then are cut (their rooms fail). Hard,
	// if set, cuts the drain short when it ends (a second signal).
	DrainTimeout time.Duration
	Hard         context.Context
	// OnSession, if set, hears of every session's end, as it ends.
	OnSession func(SessionEnd)
	// OnRoom, if set, hears of every room of a tiny model whose tokens
	// were checked, as it is checked (unsharded decode only).
	OnRoom func(RoomCheck)
}

// SessionEnd is one session's end on one decode rank.
type SessionEnd struct {
	Rank    int // the decode rank's index (0 unsharded)
	Ranks   int
	Prefill string
	Report  decode.SessionReport
	Err     error

	session *decode.Session
}

// Outcome is the session's outcome, as the decode metrics label it.
func (e SessionEnd) Outcome() string {
	switch {
	case e.Err == nil && e.Report.Complete:
		return "complete"
	case e.Err == nil && e.Report.Empty:
		return "empty"
	case errors.Is(e.Err, decode.ErrPrefillLost):
		return "lost"
	case errors.Is(e.Err, decode.ErrClosed):
		return "closed"
	case errors.Is(e.Err, decode.ErrSessionAborted):
		return "aborted"
	}
	return "failed"
}

// String is the line a decode process prints when a session ends.
func (e SessionEnd) String() string {
	rank := ""
	if e.Ranks > 1 {
		rank = fmt.Sprintf(" (decode rank %d of %d)", e.Rank, e.Ranks)
	}
	line := fmt.Sprintf("decode: session of %s%s ended %s: %d chunks (%d not successful), %d rooms complete",
		e.Prefill, rank, e.Outcome(), e.Report.Chunks, e.Report.Failed, e.Report.Rooms)
	if e.Err != nil {
		line += "; " + e.Err.Error()
	}
	return line
}

// serve runs the decode process's sessions on srvs (one per decode rank)
// until ctx ends or cfg.Runs prefill runs ended, then drains: no new
// session, those open may end within cfg.DrainTimeout. verified reports
// the pages checked so far and the first mismatch.
func serve(ctx context.Context, srvs []*decode.Server, cfg ServeConfig, verified func() (uint64, string)) DecodeSummary {
	ended := make(chan SessionEnd, 16)
	acceptCtx, stopAccepting := context.WithCancel(context.Background())
	defer stopAccepting()
	var mu sync.Mutex
	open := 0 // sessions accepted whose end was not taken yet
	var wg sync.WaitGroup
	for i, srv := range srvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ss, err := srv.Accept(acceptCtx)
				if err != nil {
					return
				}
				mu.Lock()
				open++
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					// A session ends at the latest when its server closes.
					rep, err := ss.Wait(context.Background())
					ended <- SessionEnd{Rank: i, Ranks: len(srvs), Prefill: ss.Prefill(), Report: rep, Err: err, session: ss}
				}()
			}
		}()
	}
	sum := DecodeSummary{Ranks: len(srvs), Outcomes: map[string]int{}}
	runs := 0
	take := func(e SessionEnd) {
		mu.Lock()
		open--
		mu.Unlock()
		sum.add(e)
		if cfg.OnSession != nil {
			cfg.OnSession(e)
		}
		if e.Rank == 0 && !e.Report.Empty {
			runs++
		}
	}
serving:
	for cfg.Runs <= 0 || runs < cfg.Runs {
		select {
		case e := <-ended:
			take(e)
		case <-ctx.Done():
			break serving
		}
	}
	// Drain: every rank at once, each within the timeout; sessions that end
	// meanwhile are still taken (and those opened just before are still
	// accepted, to be waited for).
	hard := cfg.Hard
	if hard == nil {
		hard = context.Background()
	}
	dctx, cancel := context.WithTimeout(hard, cfg.DrainTimeout)
	defer cancel()
	drained := make(chan error, len(srvs))
	for _, srv := range srvs {
		go func() { drained <- srv.Drain(dctx) }()
	}
	for left := len(srvs); left > 0; {
		select {
		case e := <-ended:
			take(e)
		case err := <-drained:
			left--
			if err != nil && sum.DrainErr == nil {
				sum.DrainErr = err
			}
		}
	}
	stopAccepting()
	// Every session the servers ended reaches ended a moment later.
	for {
		mu.Lock()
		n := open
		mu.Unlock()
		if n == 0 || dctx.Err() != nil {
			break
		}
		select {
		case e := <-ended:
			take(e)
		case <-dctx.Done():
		}
	}
	// Sessions cut by the drain's timeout end when the servers close:
	// the caller closes them, and Cut counts those still open now.
	for _, srv := range srvs {
		if st, err := srv.State(); err == nil {
			sum.Cut += st.Sessions
		}
	}
	sum.VerifiedPages, sum.Mismatch = verified()
	go func() {
		wg.Wait()
		close(ended)
	}()
	// What ends before the caller closes the servers is not waited for:
	// the goroutines end with the sessions.
	go func() {
		for range ended {
		}
	}()
	return sum
}

// DecodeSummary is what a decode process served: its sessions (every
// rank's, when sharded), their chunks and rooms, the pages it checked.
type DecodeSummary struct {
	// Ranks is the decode ranks served (1 unsharded).
	Ranks int
	// Sessions counts the sessions that ended, Outcomes them by outcome
	// (SessionEnd.Outcome).
	Sessions int
	Outcomes map[string]int
	// Chunks, Failed and Rooms add up the sessions' reports.
	Chunks, Failed, Rooms int
	VerifiedPages         uint64
	Mismatch              string
	// Err is the first error of a session that was not complete and not
	// empty, or nil.
	Err error
	// Cut counts the sessions still open when the drain timed out;
	// DrainErr says why it ended early.
	Cut      int
	DrainErr error
	// Tokens adds up the token checks of tiny models' rooms (nil: none).
	Tokens *TokenSummary
}

func (s *DecodeSummary) add(e SessionEnd) {
	s.Sessions++
	s.Outcomes[e.Outcome()]++
	s.Chunks += e.Report.Chunks
	s.Failed += e.Report.Failed
	s.Rooms += e.Report.Rooms
	if e.Err != nil && s.Err == nil && e.Outcome() != "empty" {
		s.Err = e.Err
	}
}

// Complete reports whether every session that did something completed
// with every byte equal (what a bounded run, --runs, exits 0 on).
func (s DecodeSummary) Complete() bool {
	return s.Mismatch == "" && s.Err == nil && s.Cut == 0 && s.Sessions > s.Outcomes["empty"] && (s.Tokens == nil || s.Tokens.OK())
}

// DrainedClean reports whether the drain lost nothing in flight (what a
// service exits 0 on: sessions that failed earlier are in the summary and
// the metrics, not in its exit code).
func (s DecodeSummary) DrainedClean() bool { return s.Cut == 0 }

// String is the decode process's summary line.
func (s DecodeSummary) String() string {
	var outcomes []string
	for _, o := range decode.SessionOutcomes {
		if n := s.Outcomes[o]; n > 0 {
			outcomes = append(outcomes, fmt.Sprintf("%d %s", n, o))
		}
	}
	slices.Sort(outcomes)
	by := "none"
	if len(outcomes) > 0 {
		by = strings.Join(outcomes, ", ")
	}
	ranks := ""
	if s.Ranks > 1 {
		ranks = fmt.Sprintf(" on %d ranks", s.Ranks)
	}
	line := fmt.Sprintf("decode: served %d sessions%s (%s): %d chunks (%d not successful), %d rooms complete",
		s.Sessions, ranks, by, s.Chunks, s.Failed, s.Rooms)
	if s.Tokens == nil || s.VerifiedPages > 0 || s.Mismatch != "" {
		// A tiny model's rooms are checked by their tokens, not their bytes.
		line += fmt.Sprintf(", %d pages verified, bytes equal: %v", s.VerifiedPages, s.Mismatch == "")
	}
	if s.Tokens != nil {
		line += "; " + s.Tokens.String()
	}
	if s.Cut > 0 {
		line += fmt.Sprintf("; %d sessions cut by the drain timeout", s.Cut)
	}
	if s.Mismatch != "" {
		line += "; first mismatch: " + s.Mismatch
	}
	if s.Err != nil {
		line += "; first failure: " + s.Err.Error()
	}
	return line
}
