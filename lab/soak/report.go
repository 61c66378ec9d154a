package soak

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Report is what a soak did and found.
type Report struct {
	// OK is the verdict: no entry in Failures.
	OK       bool     `json:"ok"`
	Failures []string `json:"failures"`
	// Seconds is the whole soak's wall time, warm-up and settling included.
	Seconds float64 `json:"duration_s"`
	Seed    uint64  `json:"seed"`
	Mix     string  `json:"mix"`
	// UCXTLS is UCX_TLS as the processes saw it ("" when unset: UCX's
	// choice).
	UCXTLS string `json:"ucx_tls"`
	// Episodes counts the main lane's episodes after the warm-up.
	Episodes int `json:"episodes"`
	// Served counts the episodes run, by kind (the warm-up among the clean
	// ones); Injected those in which the fault happened (a prefill that
	// ended before its instant was not faulted: it ran as a clean one,
	// and was judged as one).
	Served   map[Kind]int `json:"served"`
	Injected map[Kind]int `json:"faults_injected"`
	// DecodeCrashes counts the decode process's crashes: an exit the soak
	// did not ask for, or a line that says it crashed (a UCX "Fatal", a Go
	// panic or fatal error, SIGSEGV, SIGABRT, a recovered panic, a data race
	// report).
	DecodeCrashes int    `json:"decode_crashes"`
	Crash         string `json:"crash,omitempty"`
	// Corrupt counts legitimate sessions (clean, or faulted too late to be)
	// whose prefill did not find every byte equal ("bytes equal: false",
	// "bytes differ"); LegitFailed those that failed otherwise.
	Corrupt     int `json:"corrupt"`
	LegitFailed int `json:"legit_failed"`
	// Misbehaved counts faults the processes did not answer as they must:
	// a stopped prefill the decode did not declare lost within its bound, a
	// resumed one that did not fail on its own within its bound, a session
	// the decode did not end, a refused Hello that was admitted, a
	// bye-writer write refused before its Bye.
	Misbehaved int `json:"misbehaved"`
	// ByeWriter is what the bye-writers' writes did.
	ByeWriter ByeWriterStats `json:"bye_writer"`
	// DecodeSessions counts the decode's sessions by outcome, as its
	// /metrics said at the end figures (after a crash: at the last sample);
	// QuarantinedPages the pages it keeps out for good (a prefill's access
	// it could not confirm revoked).
	DecodeSessions   map[string]int `json:"decode_sessions"`
	QuarantinedPages int            `json:"decode_quarantined_pages"`
	// DecodeExit is how the decode process ended after SIGTERM, and its
	// summary line.
	DecodeExit    string `json:"decode_exit"`
	DecodeSummary string `json:"decode_summary"`
	// What the decode process held: after the warm-up (start), at most
	// (peak, sampled every 250 ms), after the last episode (end).
	// StartFigures and EndFigures say whether those were taken (a crashed
	// decode has no end figures); growth is judged only with both.
	RSSMiB       Usage  `json:"rss_mib"`
	FDs          Usage  `json:"fds"`
	Goroutines   Usage  `json:"goroutines"`
	StartFigures bool   `json:"start_figures"`
	EndFigures   bool   `json:"end_figures"`
	Samples      int    `json:"samples"`
	Bounds       Bounds `json:"bounds"`
	// Interrupted says the soak was stopped early (its context, a crash)
	// and why.
	Interrupted string `json:"interrupted,omitempty"`
	// Notes are the first few failures' details: what each process said.
	Notes []string `json:"notes,omitempty"`
}

// ByeWriterStats counts the bye-writers' sessions and writes. A post is one
// batch of writes; after Bye every post must fail, at Post or at its
// completion.
type ByeWriterStats struct {
	Sessions int `json:"sessions"`
	// PostsBeforeBye all completed successfully (else Misbehaved).
	PostsBeforeBye int `json:"posts_before_bye"`
	// PostsAfterBye were posted after Bye returned: refused by Post, failed
	// at completion, completed successfully (Landed: must be 0), or not
	// completed within 10 s (Unanswered). Reconnects counts the fresh
	// endpoints to the revoked access point opened after an endpoint broke
	// (a peer that comes back; they must land nothing either).
	PostsAfterBye      int `json:"posts_after_bye"`
	RefusedAfterBye    int `json:"refused_after_bye"`
	FailedAfterBye     int `json:"failed_after_bye"`
	LandedAfterBye     int `json:"landed_after_bye"`
	UnansweredAfterBye int `json:"unanswered_after_bye"`
	Reconnects         int `json:"reconnects_after_bye"`
}

// Usage is one figure of the decode process at the start, its peak and at
// the end.
type Usage struct {
	Start float64 `json:"start"`
	Peak  float64 `json:"peak"`
	End   float64 `json:"end"`
}

// Growth is End - Start.
func (u Usage) Growth() float64 { return u.End - u.Start }

// maxNotes bounds Report.Notes.
const maxNotes = 10

// note keeps a failure's detail, up to maxNotes of them.
func (r *Report) note(format string, args ...any) {
	if len(r.Notes) < maxNotes {
		r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
	}
}

// judge sets Failures and OK from the counts and the bounds.
func (r *Report) judge() {
	var f []string
	add := func(format string, args ...any) { f = append(f, fmt.Sprintf(format, args...)) }
	if r.Interrupted != "" {
		add("interrupted: %s", r.Interrupted)
	}
	if r.DecodeCrashes > 0 {
		add("decode crashed: %s", r.Crash)
	}
	if r.Corrupt > 0 {
		add("%d legitimate sessions without every byte equal", r.Corrupt)
	}
	if r.LegitFailed > 0 {
		add("%d legitimate sessions failed", r.LegitFailed)
	}
	if r.ByeWriter.LandedAfterBye > 0 {
		add("%d bye-writer writes completed after their Bye returned", r.ByeWriter.LandedAfterBye)
	}
	if r.Misbehaved > 0 {
		add("%d faults not answered as they must be (see notes)", r.Misbehaved)
	}
	if r.DecodeExit != "" && r.DecodeExit != exitClean {
		add("decode after SIGTERM: %s", r.DecodeExit)
	}
	if r.StartFigures && r.EndFigures {
		if g := r.RSSMiB.Growth(); g > r.Bounds.RSSGrowthMiB {
			add("decode RSS grew %.1f MiB (%.1f to %.1f), above --max-rss-growth-mib %v", g, r.RSSMiB.Start, r.RSSMiB.End, r.Bounds.RSSGrowthMiB)
		}
		if g := r.FDs.Growth(); g > float64(r.Bounds.FDGrowth) {
			add("decode open files grew by %.0f (%.0f to %.0f), above --max-fd-growth %d", g, r.FDs.Start, r.FDs.End, r.Bounds.FDGrowth)
		}
		if g := r.Goroutines.Growth(); g > float64(r.Bounds.GoroutineGrowth) {
			add("decode goroutines grew by %.0f (%.0f to %.0f), above --max-goroutine-growth %d", g, r.Goroutines.Start, r.Goroutines.End, r.Bounds.GoroutineGrowth)
		}
	} else if r.Interrupted == "" && r.DecodeCrashes == 0 {
		add("the decode process's start and end figures were not both taken")
	}
	r.Failures, r.OK = f, len(f) == 0
}

// exitClean is DecodeExit for a decode that drained and exited 0.
const exitClean = "exit 0"

// Text is the report in a few lines.
func (r Report) Text() string {
	var b strings.Builder
	verdict := "ok"
	if !r.OK {
		verdict = "FAILED: " + strings.Join(r.Failures, "; ")
	}
	tls := r.UCXTLS
	if tls == "" {
		tls = "UCX's choice"
	}
	fmt.Fprintf(&b, "soak: %v, %d episodes after a clean warm-up, UCX_TLS %s, seed %d, mix %s: %s\n",
		time.Duration(r.Seconds*float64(time.Second)).Round(time.Second), r.Episodes, tls, r.Seed, r.Mix, verdict)
	fmt.Fprintf(&b, "  served (faults injected): %s\n", kindCounts(r.Served, r.Injected))
	exit := r.DecodeExit + " after SIGTERM"
	if r.DecodeExit == "" {
		exit = "not stopped by the soak"
	}
	fmt.Fprintf(&b, "  decode: %d crashes, sessions %s, %d pages quarantined, %s\n",
		r.DecodeCrashes, outcomeCounts(r.DecodeSessions), r.QuarantinedPages, exit)
	fmt.Fprintf(&b, "  legitimate sessions: %d corrupt, %d failed; faults misbehaved: %d\n", r.Corrupt, r.LegitFailed, r.Misbehaved)
	bw := r.ByeWriter
	fmt.Fprintf(&b, "  bye-writer: %d sessions, %d posts before Bye; after Bye %d posts (%d reconnects): %d refused, %d failed, %d unanswered, %d landed\n",
		bw.Sessions, bw.PostsBeforeBye, bw.PostsAfterBye, bw.Reconnects, bw.RefusedAfterBye, bw.FailedAfterBye, bw.UnansweredAfterBye, bw.LandedAfterBye)
	if r.StartFigures && r.EndFigures {
		fmt.Fprintf(&b, "  decode RSS MiB %.1f -> peak %.1f -> %.1f (%+.1f, bound %v); open files %.0f -> %.0f -> %.0f (%+.0f, bound %d); goroutines %.0f -> %.0f -> %.0f (%+.0f, bound %d); %d samples\n",
			r.RSSMiB.Start, r.RSSMiB.Peak, r.RSSMiB.End, r.RSSMiB.Growth(), r.Bounds.RSSGrowthMiB,
			r.FDs.Start, r.FDs.Peak, r.FDs.End, r.FDs.Growth(), r.Bounds.FDGrowth,
			r.Goroutines.Start, r.Goroutines.Peak, r.Goroutines.End, r.Goroutines.Growth(), r.Bounds.GoroutineGrowth, r.Samples)
	} else if r.StartFigures {
		fmt.Fprintf(&b, "  decode RSS MiB %.1f -> peak %.1f; open files %.0f -> %.0f; goroutines %.0f -> %.0f; no end figures; %d samples\n",
			r.RSSMiB.Start, r.RSSMiB.Peak, r.FDs.Start, r.FDs.Peak, r.Goroutines.Start, r.Goroutines.Peak, r.Samples)
	} else {
		fmt.Fprintf(&b, "  decode: no start figures\n")
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	return b.String()
}

// kindCounts spells served and injected counts in Kinds' order.
func kindCounts(served, injected map[Kind]int) string {
	var parts []string
	for _, k := range Kinds() {
		if served[k] == 0 && injected[k] == 0 {
			continue
		}
		s := fmt.Sprintf("%s %d", k, served[k])
		if k != Clean {
			s += fmt.Sprintf(" (%d)", injected[k])
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// outcomeCounts spells the decode's sessions by outcome, sorted.
func outcomeCounts(m map[string]int) string {
	var parts []string
	for _, o := range slices.Sorted(maps.Keys(m)) {
		if m[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[o], o))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
