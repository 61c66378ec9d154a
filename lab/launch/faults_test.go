package launch

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFault(t *testing.T) {
	for _, s := range []string{"", "kill-decode", "kill-prefill", "pause-etcd", "rolling-restart"} {
		f, err := ParseFault(s)
		require.NoError(t, err)
		assert.Equal(t, Fault(s), f)
	}
	_, err := ParseFault("flood")
	assert.ErrorContains(t, err, `--fault "flood"`)
}

// killRecorder is the injector's kill: it records its victims.
type killRecorder struct {
	mu     sync.Mutex
	killed []string
	struck []time.Time
}

func (k *killRecorder) kill(id string) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed = append(k.killed, id)
	return 4242, nil
}

func (k *killRecorder) at(t time.Time) { k.mu.Lock(); k.struck = append(k.struck, t); k.mu.Unlock() }

// TestInjectorKillsOnce: the first forward of the fault's batch kills its
// victim (kill-decode: the batch's instance; kill-prefill: the last rank),
// once; only the decode instance it killed is restarted, and not while
// the launcher stops.
func TestInjectorKillsOnce(t *testing.T) {
	var k killRecorder
	f := &injector{fault: KillDecode, batch: 1, lastRank: "g0-r3", kill: k.kill, struck: k.at}
	f.forward(Event{Event: EventForward, Batch: 0, Decode: "decode-0"})
	f.forward(Event{Event: EventForward, Batch: 1, Decode: "decode-1"})
	f.forward(Event{Event: EventForward, Batch: 1, Decode: "decode-1"})
	assert.Equal(t, []string{"decode-1"}, k.killed)
	assert.Len(t, k.struck, 1)
	assert.Equal(t, []string{"kill-decode: SIGKILL decode-1 (pid 4242) at the first forward of batch 1"}, f.Notes())
	assert.True(t, f.restart("decode-1", false))
	assert.False(t, f.restart("decode-0", false), "only the victim")
	assert.False(t, f.restart("decode-1", true), "not while stopping")

	k = killRecorder{}
	f = &injector{fault: KillPrefill, batch: 0, lastRank: "g0-r3", kill: k.kill, struck: k.at}
	f.forward(Event{Event: EventForward, Batch: 0, Decode: "decode-0"})
	assert.Equal(t, []string{"g0-r3"}, k.killed)
	assert.False(t, f.restart("g0-r3", false), "a killed rank stays dead")

	k = killRecorder{}
	f = &injector{fault: NoFault, kill: k.kill, struck: k.at}
	f.forward(Event{Event: EventForward, Batch: 0})
	assert.Empty(t, k.killed)
}

// fakeEtcd pauses and resumes on demand; list fails while paused.
type fakeEtcd struct {
	mu     sync.Mutex
	paused bool
	calls  []string
}

func (e *fakeEtcd) Pause() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.paused = true
	e.calls = append(e.calls, "pause")
	return nil
}
func (e *fakeEtcd) Resume() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.paused = false
	e.calls = append(e.calls, "resume")
	return nil
}
func (e *fakeEtcd) List(ctx context.Context, _ cluster.Role) ([]cluster.Member, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.paused {
		return nil, errors.Mark(errors.New("etcd unreachable at x"), cluster.ErrUnavailable)
	}
	return nil, nil
}

// TestInjectorPausesEtcd: pause-etcd freezes etcd for its duration, notes
// a lookup that fails as unavailable during it and one that answers
// after it, and the members listed again.
func TestInjectorPausesEtcd(t *testing.T) {
	var k killRecorder
	e := &fakeEtcd{}
	f := &injector{fault: PauseEtcd, batch: 1, pause: 30 * time.Millisecond, kill: k.kill, struck: k.at}
	f.goPauseEtcd(context.Background(), e, e, func() int { return 2 }, 2, 1)
	f.wait()
	assert.Equal(t, []string{"pause", "resume"}, e.calls)
	notes := strings.Join(f.Notes(), "\n")
	assert.Contains(t, notes, "a lookup during the pause: etcd unreachable at x (unavailable: true)")
	assert.Contains(t, notes, "a lookup after it: error <nil>")
	assert.Contains(t, notes, "all 2 decode instances listed again")
	assert.Len(t, k.struck, 1)
	assert.Empty(t, k.killed)
}

// TestInjectorPauseEndsWithItsContext: a pause of etcd ends when the run's
// context does (its drain ended, or a second signal), not when its
// duration runs out: etcd is resumed at once and the note says why. A
// pause once slept its whole --fault-for, however many signals came.
func TestInjectorPauseEndsWithItsContext(t *testing.T) {
	var k killRecorder
	e := &fakeEtcd{}
	paused := make(chan struct{})
	f := &injector{fault: PauseEtcd, batch: 1, pause: MaxFaultFor, kill: k.kill, struck: k.at,
		say: func(string, ...any) { close(paused) }}
	ctx, cut := context.WithCancelCause(context.Background())
	f.goPauseEtcd(ctx, e, e, func() int { return 2 }, 2, 1)
	<-paused
	cut(errors.New("cut by a second stop (interrupt, after terminated)"))
	ended := make(chan struct{})
	go func() { f.wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatalf("the pause did not end with its context (it lasts %v)", MaxFaultFor)
	}
	e.mu.Lock()
	assert.Equal(t, []string{"pause", "resume"}, e.calls, "etcd resumed")
	e.mu.Unlock()
	assert.Contains(t, strings.Join(f.Notes(), "\n"), "into the pause (cut by a second stop (interrupt, after terminated)): etcd resumed")
}

// TestConfigBoundsFaultFor: --fault-for is refused above MaxFaultFor (and
// below zero), naming the flag, the value and the bound; the bound itself
// is accepted.
func TestConfigBoundsFaultFor(t *testing.T) {
	cfg := func(d time.Duration) *Config {
		return &Config{Exe: "/bin/true", Ranks: 1, Decodes: 1, Requests: 1, Fault: PauseEtcd, FaultBatch: 1, FaultFor: d}
	}
	require.NoError(t, cfg(MaxFaultFor).Check())
	require.NoError(t, cfg(0).Check())
	for _, d := range []time.Duration{MaxFaultFor + time.Nanosecond, 1000000 * time.Hour, -time.Second} {
		err := cfg(d).Check()
		require.Error(t, err, d)
		assert.Contains(t, err.Error(), "--fault-for "+d.String()+": want 0 to 10m0s", d)
	}
}

// TestInjectorRollsEveryDecode: from the fault batch's first forward, each
// decode instance in turn is avoided by the router before its SIGTERM,
// restarted once it exited, and the next one drains only once it is
// registered again; an exit that is not 0 stops the roll.
func TestInjectorRollsEveryDecode(t *testing.T) {
	k := &killRecorder{}
	var mu sync.Mutex
	back := map[string]bool{"decode-0": true, "decode-1": true, "decode-2": true}
	var restarted []string
	var termed atomic.Int32
	f := &injector{fault: RollingRestart, batch: 1, decodes: []string{"decode-0", "decode-1", "decode-2"}, struck: k.at,
		ctx: context.Background(), registered: func(id string) bool { mu.Lock(); defer mu.Unlock(); return back[id] },
		// Batch 5 is open on decode-0 until the end: both ranks' sessions
		// must be open (a forward each) before it drains.
		openOn: func(id string) []int {
			if id == "decode-0" {
				return []int{5}
			}
			return nil
		}, ranks: 2}
	f.term = func(id string) (int, error) {
		termed.Add(1)
		assert.True(t, f.avoid(id), "%s avoided before its SIGTERM", id)
		mu.Lock()
		for other, ok := range back {
			assert.True(t, ok, "%s drains while %s is not back", id, other)
		}
		back[id] = false
		mu.Unlock()
		var exit error
		if id == "decode-2" {
			exit = errors.New("exit status 1")
		}
		// Its process drains and exits; up restarts it; it registers
		// again.
		go func() {
			f.exited(id, exit)
			if f.restart(id, false) {
				mu.Lock()
				restarted = append(restarted, id)
				back[id] = true
				mu.Unlock()
			}
		}()
		return 7, nil
	}
	f.forward(Event{Event: EventForward, Batch: 5, Rank: 0})
	f.forward(Event{Event: EventForward, Batch: 0})
	f.forward(Event{Event: EventForward, Batch: 1})
	f.forward(Event{Event: EventForward, Batch: 1})
	assert.False(t, f.Gate("decode-0", func() { t.Error("a batch started on an instance being drained") }))
	assert.True(t, f.Gate("decode-1", func() {}))
	assert.Zero(t, termed.Load(), "decode-0 drained before its batch 5 was under way")
	f.forward(Event{Event: EventForward, Batch: 5, Rank: 1})
	f.wait()
	mu.Lock()
	assert.Equal(t, []string{"decode-0", "decode-1", "decode-2"}, restarted)
	mu.Unlock()
	assert.False(t, f.avoid("decode-2"))
	assert.Len(t, k.struck, 1)
	notes := strings.Join(f.Notes(), "\n")
	assert.Contains(t, notes, "rolling-restart: decode-0 (pid 7) drained and exited (exit 0)")
	assert.Contains(t, notes, "rolling-restart: decode-2 (pid 7) drained and exited (exit status 1)")
	assert.NotContains(t, notes, "every decode instance drained and came back", "an exit that is not 0 is no clean roll")
}
