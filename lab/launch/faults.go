package launch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
)

// Fault is a failure Up injects at the first forward of one batch.
type Fault string

// The faults.
const (
	NoFault Fault = ""
	// KillDecode: SIGKILL the batch's decode instance, then restart it
	// under the same id.
	KillDecode Fault = "kill-decode"
	// KillPrefill: SIGKILL the last rank; no batch is started after it.
	KillPrefill Fault = "kill-prefill"
	// PauseEtcd: freeze etcd (SIGSTOP) for a while: a lookup during the
	// pause must fail as unavailable, and one after it succeed.
	PauseEtcd Fault = "pause-etcd"
	// RollingRestart: drain every decode instance in turn, under load
	// (SIGTERM, as an orchestrator's rolling update does): no new batch
	// goes to it while it drains, its ranks finish their batch there and
	// say goodbye (it told them: wire.Drain), it exits; it is restarted
	// under its id and, once registered again, the next one drains. No
	// request may be lost.
	RollingRestart Fault = "rolling-restart"
)

// rollBound bounds each step of a rolling restart: an instance's drain
// (its batch in flight finishing first) and its return.
const rollBound = 2 * time.Minute

// ParseFault reads --fault.
func ParseFault(s string) (Fault, error) {
	switch f := Fault(s); f {
	case NoFault, KillDecode, KillPrefill, PauseEtcd, RollingRestart:
		return f, nil
	}
	return "", errors.Newf("--fault %q: want kill-decode, kill-prefill, pause-etcd or rolling-restart", s)
}

// pauser freezes and continues etcd (etcdproc.Proc).
type pauser interface {
	Pause() error
	Resume() error
}

// lister lists a role's members straight from etcd (a Provider).
type lister interface {
	List(ctx context.Context, role cluster.Role) ([]cluster.Member, error)
}

// MaxFaultFor bounds --fault-for: a pause-etcd fault long enough to
// outlast every lease and timeout of a run (the longest is a batch's
// 2×finish timeout + 2 minutes), short enough that a mistyped duration
// (1000000h) cannot freeze a run's etcd for good.
const MaxFaultFor = 10 * time.Minute

// injector injects one fault and records what it saw in notes.
type injector struct {
	fault Fault
	batch int           // the batch whose first forward triggers it
	pause time.Duration // how long pause-etcd freezes etcd
	// lastRank is kill-prefill's victim.
	lastRank string
	kill     func(id string) (pid int, err error)
	struck   func(at time.Time) // tells the book when the fault struck
	// say prints a status line (nil: none).
	say func(format string, args ...any)

	// rolling-restart: the decode instances, in order; term sends one
	// SIGTERM; registered says whether one is registered again by its
	// new process; openOn lists the batches open on one, ranks is the
	// number of ranks whose forwards each needs; ctx ends the restarts
	// (the run's end: its drain or its cut).
	decodes    []string
	term       func(id string) (pid int, err error)
	registered func(id string) bool
	openOn     func(id string) []int
	ranks      int
	ctx        context.Context
	// gate makes a batch's start and the choice of the instance to drain
	// atomic (Gate): no batch starts on an instance once it is avoided.
	gate sync.Mutex

	running sync.WaitGroup // a pause or a rolling restart in progress

	mu      sync.Mutex
	faulted bool
	killed  string // the node kill-decode killed
	// draining is the instance a rolling restart drains now, exits where
	// its exit is reported.
	draining string
	exits    chan error
	// forwarded are the ranks that reported a forward, by batch: their
	// sessions with the batch's instance are open.
	forwarded map[int]map[int]bool
	notes     []string
}

func (f *injector) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

// Notes are the fault's notes so far.
func (f *injector) Notes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.notes...)
}

// forward sees every "forward" event: the first of the fault's batch
// kills the victim (kill-decode: the batch's instance, named in the
// event; kill-prefill: the last rank).
func (f *injector) forward(e Event) {
	f.mu.Lock()
	if f.fault == RollingRestart {
		if f.forwarded == nil {
			f.forwarded = map[int]map[int]bool{}
		}
		if f.forwarded[e.Batch] == nil {
			f.forwarded[e.Batch] = map[int]bool{}
		}
		f.forwarded[e.Batch][e.Rank] = true
	}
	if f.faulted || e.Batch != f.batch || (f.fault != KillDecode && f.fault != KillPrefill && f.fault != RollingRestart) {
		f.mu.Unlock()
		return
	}
	f.faulted = true
	if f.fault == RollingRestart {
		f.mu.Unlock()
		f.struck(time.Now())
		// The first instance is avoided from this forward on.
		first := f.mark(0)
		f.running.Add(1)
		go func() {
			defer f.running.Done()
			f.roll(e.Batch, first)
		}()
		return
	}
	victim := e.Decode
	if f.fault == KillPrefill {
		victim = f.lastRank
	} else {
		f.killed = victim
	}
	f.mu.Unlock()
	at := time.Now()
	f.struck(at)
	pid, err := f.kill(victim)
	if err != nil {
		f.note("%s: %s: %v", f.fault, victim, err)
		return
	}
	f.note("%s: SIGKILL %s (pid %d) at the first forward of batch %d", f.fault, victim, pid, e.Batch)
}

// restart says whether node id, which just exited, is to be restarted:
// the decode instance kill-decode killed or a rolling restart drained,
// unless the launcher is stopping.
func (f *injector) restart(id string, stopping bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !stopping && (f.fault == KillDecode && f.killed == id || f.fault == RollingRestart && f.draining == id)
}

// exited hears of node id's exit, with its status: the instance a
// rolling restart drains reports it to roll.
func (f *injector) exited(id string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.draining == id && f.exits != nil {
		select {
		case f.exits <- err:
		default:
		}
	}
}

// avoid says whether decode instance id is being drained on purpose: the
// router sends it no new batch.
func (f *injector) avoid(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.draining == id
}

// Gate runs start (a batch's start on decode instance id) unless id is
// avoided, atomically with roll's choice of the instance to drain: a
// batch either starts before the instance is avoided (and roll waits for
// it to be under way) or goes elsewhere.
func (f *injector) Gate(id string, start func()) bool {
	f.gate.Lock()
	defer f.gate.Unlock()
	if f.avoid(id) {
		return false
	}
	start()
	return true
}

// underWay reports whether every batch open on id has every rank's session
// with it open (each rank reported a forward): a SIGTERM then cuts no
// Hello of a batch it was given.
func (f *injector) underWay(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.openOn(id) {
		if len(f.forwarded[b]) < f.ranks {
			return false
		}
	}
	return true
}

// roll is the rolling restart, from batch b's first forward: each decode
// instance in turn is avoided, sent SIGTERM, and waited for: its drain
// (exit 0 when it lost nothing), its restart, its registration again. Each
// wait is bounded by rollBound and ends with f.ctx.
func (f *injector) roll(b int, first <-chan error) {
	if f.say != nil {
		f.say("rolling-restart: draining the %d decode instances one after another from batch %d", len(f.decodes), b)
	}
	for i, id := range f.decodes {
		exits := first
		if i > 0 {
			exits = f.mark(i)
		}
		ok := f.rollOne(id, exits)
		f.mu.Lock()
		f.draining, f.exits = "", nil
		f.mu.Unlock()
		if !ok {
			return
		}
	}
	f.note("rolling-restart: every decode instance drained and came back")
}

// mark avoids decode instance i from now on (no batch starts on it after
// this returns) and returns where its exit will be reported.
func (f *injector) mark(i int) <-chan error {
	exits := make(chan error, 1)
	f.gate.Lock()
	defer f.gate.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < len(f.decodes) {
		f.draining, f.exits = f.decodes[i], exits
	}
	return exits
}

// rollOne drains decode instance id and waits for it to be back.
func (f *injector) rollOne(id string, exits <-chan error) bool {
	bound := time.NewTimer(rollBound)
	defer bound.Stop()
	poll := time.NewTicker(20 * time.Millisecond) // a poll of the book and the followed (in-memory) membership
	defer poll.Stop()
	// The batches it was given are under way first: a rank that has not
	// said Hello to it yet would be refused (it drains) and fail its batch.
	for !f.underWay(id) {
		select {
		case <-poll.C:
		case <-bound.C:
			f.note("rolling-restart: %s: its batches were not under way within %v", id, rollBound)
			return false
		case <-f.ctx.Done():
			f.note("rolling-restart: cut before %s drained (%v)", id, context.Cause(f.ctx))
			return false
		}
	}
	at := time.Now()
	pid, err := f.term(id)
	if err != nil {
		f.note("rolling-restart: %s: %v", id, err)
		return false
	}
	var exit error
	select {
	case exit = <-exits:
	case <-bound.C:
		f.note("rolling-restart: %s (pid %d) did not exit within %v of its SIGTERM", id, pid, rollBound)
		return false
	case <-f.ctx.Done():
		f.note("rolling-restart: cut while %s drained (%v)", id, context.Cause(f.ctx))
		return false
	}
	drained := time.Since(at)
	status := "exit 0"
	if exit != nil {
		status = exit.Error()
	}
	for !f.registered(id) {
		select {
		case <-poll.C:
		case <-bound.C:
			f.note("rolling-restart: %s drained (%s) in %d ms but was not registered again within %v", id, status, drained.Milliseconds(), rollBound)
			return false
		case <-f.ctx.Done():
			f.note("rolling-restart: cut while %s came back (%v)", id, context.Cause(f.ctx))
			return false
		}
	}
	f.note("rolling-restart: %s (pid %d) drained and exited (%s) %d ms after its SIGTERM; restarted, registered again %d ms later",
		id, pid, status, drained.Milliseconds(), (time.Since(at) - drained).Milliseconds())
	return exit == nil
}

// pauseEtcd freezes etcd for f.pause while batch b is in flight, checks a
// lookup during the pause (unavailable) and after it (answers), and waits
// (up to 30 s) for the decode instances, whose leases may have run out,
// to be listed again by the followed membership (members). Every wait of
// it ends with ctx (the run's drain ending, or a second signal): etcd is
// then resumed at once, so that the nodes can deregister and etcd stop,
// and the checks after the pause are skipped.
func (f *injector) pauseEtcd(ctx context.Context, etcd pauser, prov lister, members func() int, decodes, b int) {
	f.mu.Lock()
	f.faulted = true
	f.mu.Unlock()
	f.struck(time.Now())
	if err := etcd.Pause(); err != nil {
		f.note("pause-etcd: %v", err)
		return
	}
	paused := time.Now()
	if f.say != nil {
		f.say("pause-etcd: etcd frozen for %v during batch %d", f.pause, b)
	}
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err := prov.List(lctx, cluster.RoleDecode)
	cancel()
	f.note("pause-etcd: etcd frozen for %v during batch %d; a lookup during the pause: %v (unavailable: %v)",
		f.pause, b, err, errors.Is(err, cluster.ErrUnavailable))
	// The fault's duration, not a synchronisation; the run's end cuts it.
	t := time.NewTimer(max(f.pause-time.Since(paused), 0))
	defer t.Stop()
	var cut error
	select {
	case <-t.C:
	case <-ctx.Done():
		cut = context.Cause(ctx)
	}
	if err := etcd.Resume(); err != nil {
		f.note("pause-etcd: resume: %v", err)
		return
	}
	if cut != nil {
		f.note("pause-etcd: cut short %v into the pause (%v): etcd resumed", time.Since(paused).Round(time.Millisecond), cut)
		return
	}
	resumed := time.Now()
	lctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	_, err = prov.List(lctx, cluster.RoleDecode)
	cancel()
	f.note("pause-etcd: resumed; a lookup after it: error %v", err)
	poll := time.NewTicker(20 * time.Millisecond) // a poll of the followed (in-memory) membership
	defer poll.Stop()
	for time.Since(resumed) < 30*time.Second {
		if members() == decodes {
			f.note("pause-etcd: all %d decode instances listed again %d ms after the resume", decodes, time.Since(resumed).Milliseconds())
			return
		}
		select {
		case <-poll.C:
		case <-ctx.Done():
			f.note("pause-etcd: cut while waiting for the decode instances to be listed again (%v)", context.Cause(ctx))
			return
		}
	}
	f.note("pause-etcd: the decode instances were not all listed again 30 s after the resume")
}

// goPauseEtcd runs pauseEtcd in the background, until ctx ends at the
// latest; wait waits for it.
func (f *injector) goPauseEtcd(ctx context.Context, etcd pauser, prov lister, members func() int, decodes, b int) {
	f.running.Add(1)
	go func() {
		defer f.running.Done()
		f.pauseEtcd(ctx, etcd, prov, members, decodes, b)
	}()
}

// wait returns once a pause-etcd fault in progress ended: at its end, or
// at once when the context goPauseEtcd was given ended.
func (f *injector) wait() { f.running.Wait() }
