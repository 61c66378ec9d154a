package soak

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvstream/kvstream/internal/portlease"
)

// run is how one main-lane prefill went.
type run struct {
	name     string           // its node's address: the session's name on the decode
	port     *portlease.Lease // holds name's port until the episode ended
	c        *child
	injected bool
	legit    bool     // it ran to its end, every byte equal
	what     []string // what happened, for the episode's line
}

func (r *run) say(format string, args ...any) { r.what = append(r.what, fmt.Sprintf(format, args...)) }

// mainEpisode runs one main-lane episode of kind k (0: the warm-up) and
// waits until the decode ended its sessions. It reports whether k's fault
// happened (a clean one: whether it ran).
func (s *soak) mainEpisode(i int, k Kind, rng *rand.Rand) bool {
	if k == PauseDecode {
		s.gate.Lock()
		defer s.gate.Unlock()
	}
	r, err := s.startPrefill()
	if err != nil {
		s.mu.Lock()
		s.halt = "cannot start a prefill: " + err.Error()
		s.mu.Unlock()
		return false
	}
	// Its name stays its own until the decode ended its session.
	defer r.port.Release()
	switch k {
	case Clean:
		r.c.wait(runBound)
	case Kill:
		s.kill(r, rng)
	case Stop:
		s.stop(r, rng)
	case PauseDecode:
		s.pauseDecode(r, rng)
	}
	if done, _ := r.c.exited(); !done {
		r.say("no exit within its bound: killed")
		if !r.injected {
			s.legit(k, r, "failed", "no exit within "+runBound.String())
		}
		r.c.kill()
	}
	if strings.Contains(r.c.output(), "address already in use") {
		// Another listener bound the held port first (one that sets
		// SO_REUSEADDR may): nothing ran.
		fmt.Fprintf(s.cfg.Log, "soak: #%d %s: its port %s was taken: not run\n", i, k, r.name)
		return false
	}
	if !r.injected {
		s.judgeRun(k, r)
	}
	s.awaitEnd(r)
	s.mu.Lock()
	// The window a fault can hit: to its session's end (the process then
	// still closes its engine, transport and node).
	if opened, ended, ok := s.dec.span(r.name); ok && r.legit {
		s.runs = append(s.runs, ended.Sub(r.c.started))
		s.afterOpen = append(s.afterOpen, ended.Sub(opened))
	}
	s.rep.Served[k]++
	if r.injected && k != Clean {
		s.rep.Injected[k]++
	}
	s.mu.Unlock()
	label := fmt.Sprintf("#%d %s", i, k)
	if i == 0 {
		label = "warm-up clean"
	}
	fmt.Fprintf(s.cfg.Log, "soak: %s (%s): %s\n", label, r.name, strings.Join(r.what, "; "))
	return r.injected || k == Clean
}

// startPrefill starts a kvstream prefill with the soak's workload, on a
// port of its own, held for it (portlease) until the episode releases it:
// the decode names its session by it.
func (s *soak) startPrefill() (*run, error) {
	port, err := portlease.Take("127.0.0.1", true)
	if err != nil {
		return nil, err
	}
	name := port.Addr("127.0.0.1")
	args := slices.Concat([]string{"prefill", "--decode", s.dec.addr, "--listen", name, "--model", "small",
		"--resident", strconv.Itoa(s.cfg.Workload.Requests), "--seed", strconv.FormatUint(s.cfg.Seed, 10),
		"--no-progress", "--heartbeat", s.cfg.Heartbeat.String(), "--connect-timeout", "30s",
		"--finish-timeout", finishTimeout.String()}, s.cfg.Workload.Flags())
	c, err := startChild(s.cfg.Command, nil, args...)
	if err != nil {
		port.Release()
		return nil, err
	}
	return &run{name: name, port: port, c: c}, nil
}

// instant is a random instant within the first 60% of a legitimate run's
// window (from its start, or from its session's opening, to its session's
// end; the median of those so far): anywhere from the process's start
// (Hello included) through its transfers, early enough that the run
// rarely ends first.
func (s *soak) instant(rng *rand.Rand, fromOpen bool) time.Duration {
	s.mu.Lock()
	ds := s.runs
	if fromOpen {
		ds = s.afterOpen
	}
	est := time.Second
	if len(ds) > 0 {
		sorted := slices.Clone(ds)
		slices.Sort(sorted)
		est = sorted[len(sorted)/2]
	}
	s.mu.Unlock()
	return time.Duration(rng.Int64N(int64(est)*6/10 + 1))
}

// sleepOrExit waits d or until the prefill exited; it reports whether it
// still runs.
func sleepOrExit(r *run, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.c.done:
		return false
	case <-t.C:
		return true
	}
}

// kill kills the prefill at a random instant of its run (SIGKILL).
func (s *soak) kill(r *run, rng *rand.Rand) {
	at := s.instant(rng, false)
	if !sleepOrExit(r, at) || !r.c.signal(syscall.SIGKILL) {
		r.c.wait(runBound)
		return
	}
	r.c.wait(runBound)
	if r.injected = r.c.killedBy(syscall.SIGKILL); r.injected {
		opened := "before its session opened"
		if s.dec.hasOpened(r.name) {
			opened = "with its session open"
		}
		r.say("SIGKILL %v after its start, %s", at.Round(time.Millisecond), opened)
	}
}

// awaitOpen waits until the decode opened the prefill's session, or the
// prefill exited; it reports whether the session opened while the prefill
// runs.
func (s *soak) awaitOpen(r *run) bool {
	opened := s.dec.waitFor(openBound, r.c.done, func() bool {
		select {
		case <-r.c.done:
			return true
		default:
		}
		return s.dec.opened[r.name]
	})
	done, _ := r.c.exited()
	return opened && !done
}

// stop stops the prefill (SIGSTOP) at a random instant after its session
// opened, waits until the decode declared it lost, then resumes it
// (SIGCONT: it must fail on its own) or kills it.
func (s *soak) stop(r *run, rng *rand.Rand) {
	if !s.awaitOpen(r) {
		return
	}
	at := s.instant(rng, true)
	if !sleepOrExit(r, at) || !r.c.signal(syscall.SIGSTOP) {
		return
	}
	stopped := time.Now()
	ended := s.dec.waitFor(s.lostBound(), nil, func() bool { return s.dec.outcome[r.name] != "" && s.dec.open[r.name] == 0 })
	outcome, _ := s.dec.endOf(r.name)
	switch {
	case !ended:
		s.misbehaved("the decode did not end the session of %s, stopped %v after it opened, within %v", r.name, at.Round(time.Millisecond), s.lostBound())
		r.c.kill()
		r.injected = true
		return
	case outcome != "lost":
		// It ended before the stop took (its goodbye was on the way): a
		// legitimate run, judged by its exit.
		r.c.signal(syscall.SIGCONT)
		r.c.wait(runBound)
		return
	}
	r.injected = true
	r.say("SIGSTOP %v after its session opened; the decode declared it lost %v later", at.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
	if rng.IntN(2) == 0 {
		r.c.kill()
		r.say("then SIGKILL")
		return
	}
	resumed := time.Now()
	r.c.signal(syscall.SIGCONT)
	if !r.c.wait(resumeBound) {
		s.misbehaved("a prefill (%s) declared lost by the decode and resumed did not exit within %v; it printed:\n%s", r.name, resumeBound, tail(r.c.output()))
		r.c.kill()
		return
	}
	_, err := r.c.exited()
	r.say("SIGCONT: %s after %v", exitText(err), time.Since(resumed).Round(time.Millisecond))
	if err == nil {
		s.misbehaved("a prefill (%s) the decode declared lost exited 0 after it was resumed; it printed:\n%s", r.name, tail(r.c.output()))
	}
}

// pauseDecode stops the decode (SIGSTOP) at a random instant after the
// prefill's session opened, for twice the heartbeat bound: the prefill
// must declare the decode lost and exit; the decode must go on.
func (s *soak) pauseDecode(r *run, rng *rand.Rand) {
	if !s.awaitOpen(r) {
		return
	}
	at := s.instant(rng, true)
	if !sleepOrExit(r, at) {
		return
	}
	pause := 2 * s.cfg.Heartbeat
	s.dec.pause(true)
	if done, _ := r.c.exited(); done {
		// It ended as the pause began: no fault.
		s.dec.pause(false)
		return
	}
	time.Sleep(pause)
	s.dec.pause(false)
	r.injected = true
	resumed := time.Now()
	if !r.c.wait(resumeBound) {
		s.misbehaved("a prefill (%s) whose decode was stopped for %v did not exit within %v of the decode's resumption; it printed:\n%s", r.name, pause, resumeBound, tail(r.c.output()))
		r.c.kill()
		return
	}
	_, err := r.c.exited()
	r.say("decode stopped for %v, %v after the session opened; the prefill: %s %v after the resumption", pause, at.Round(time.Millisecond), exitText(err), time.Since(resumed).Round(time.Millisecond))
}

// judgeRun judges a prefill that ran to its end without a fault: exit 0
// and every byte equal.
func (s *soak) judgeRun(k Kind, r *run) {
	_, err := r.c.exited()
	out := r.c.output()
	switch {
	case err == nil && strings.Contains(out, "bytes equal: true"):
		r.say("ran to its end: bytes equal: true in %v", r.c.ended().Sub(r.c.started).Round(time.Millisecond))
		r.legit = true
	case strings.Contains(out, "bytes equal: false") || strings.Contains(out, "bytes differ"):
		s.legit(k, r, "corrupt", exitText(err))
	default:
		s.legit(k, r, "failed", exitText(err))
	}
}

// legit counts a legitimate run that failed (corrupt: its bytes), unless
// the decode crashed: then the crash is the failure.
func (s *soak) legit(k Kind, r *run, how, why string) {
	if s.dec.crashedWhy() != "" {
		r.say("failed after the decode's crash: %s", why)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if how == "corrupt" {
		s.rep.Corrupt++
	} else {
		s.rep.LegitFailed++
	}
	r.say("LEGITIMATE RUN %s: %s", strings.ToUpper(how), why)
	s.rep.note("a legitimate prefill (%s episode, %s) %s (%s); it printed:\n%s", k, r.name, how, why, tail(r.c.output()))
}

// awaitEnd waits until the decode ended the prefill's session (one that
// died before its Hello was answered may still open one, late) and every
// other main-lane session: the next prefill writes the same rooms.
func (s *soak) awaitEnd(r *run) {
	if !s.dec.hasOpened(r.name) {
		s.dec.waitFor(lateOpen, nil, func() bool { return s.dec.opened[r.name] })
	}
	if !s.dec.waitFor(s.endBound(), nil, func() bool { return len(s.dec.openLocked(false)) == 0 }) {
		if s.dec.crashedWhy() != "" {
			r.say("the decode crashed")
			return
		}
		open := s.dec.openSessions(false)
		s.misbehaved("the decode did not end the sessions of %v within %v of their prefill's end", open, s.endBound())
		s.mu.Lock()
		s.halt = fmt.Sprintf("the decode kept the sessions of %v: the next prefill's rooms would be theirs", open)
		s.mu.Unlock()
		return
	}
	if o, ok := s.dec.endOf(r.name); ok {
		r.say("decode: session %s", o)
	} else {
		r.say("decode: no session")
	}
}

// tail is the last lines of a process's output, for a note.
func tail(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) > 12 {
		lines = lines[len(lines)-12:]
	}
	return strings.Join(lines, "\n")
}
