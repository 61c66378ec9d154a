package launch

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe for the supervisor's writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fakeSupervisor runs fake nodes (the test binary) by role.
func fakeSupervisor(t *testing.T, stderr *syncBuffer) *Supervisor {
	t.Helper()
	s := NewSupervisor(os.Args[0], nil, stderr)
	t.Cleanup(s.Close)
	return s
}

func fakeSpec(id string, role cluster.Role, rank int) ChildSpec {
	return ChildSpec{ID: id, Role: role, Rank: rank, Args: []string{"-test.run=^$"},
		Env: []string{fakeNodeEnv + "=" + id, fakeRoleEnv + "=" + string(role)}}
}

// next returns the next event of node id (skipping others), failing after
// a minute.
func next(t *testing.T, s *Supervisor, id string) ChildEvent {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case ev := <-s.Events():
			if ev.ID == id {
				return ev
			}
		case <-timeout:
			t.Fatalf("no event from %s within a minute", id)
		}
	}
}

// TestSupervisorRunsNodes: nodes start with the protocol on their stdio,
// their events come out in order, a command reaches its node, a killed
// node is reported gone and restarts under its id with a new process,
// and Stop ends the ranks before the decode instances, collecting rows.
func TestSupervisorRunsNodes(t *testing.T) {
	var stderr syncBuffer
	s := fakeSupervisor(t, &stderr)
	start := func(id string, role cluster.Role, rank int) {
		require.NoError(t, s.Start(fakeSpec(id, role, rank)))
	}
	start("decode-0", cluster.RoleDecode, 0)
	ev := next(t, s, "decode-0")
	require.Equal(t, EventReady, ev.Event.Event)
	st := s.State("decode-0")
	assert.True(t, st.Running)
	assert.Equal(t, ev.Event.Addr, st.Addr, "the announced address is the node's")
	start("g0-r0", cluster.RolePrefill, 0)
	require.Equal(t, EventReady, next(t, s, "g0-r0").Event.Event)
	require.Error(t, s.Start(fakeSpec("g0-r0", cluster.RolePrefill, 0)), "an id is started once")

	require.NoError(t, s.Send("g0-r0", Command{Batch: 3, Decode: "decode-0"}.String()))
	assert.Equal(t, Event{Event: EventForward, ID: "g0-r0", Batch: 3, Decode: "decode-0"}, next(t, s, "g0-r0").Event)
	b := next(t, s, "g0-r0")
	assert.Equal(t, EventBatch, b.Event.Event)
	assert.True(t, b.Event.OK)
	assert.Equal(t, cluster.RolePrefill, b.Role)

	pid, err := s.Kill("decode-0")
	require.NoError(t, err)
	assert.Equal(t, st.Pid, pid)
	ex := next(t, s, "decode-0")
	require.True(t, ex.Exit)
	assert.Error(t, ex.ExitErr, "killed")
	assert.True(t, s.State("decode-0").Gone)
	gone, ok := s.AnyGone(cluster.RoleDecode)
	assert.True(t, ok)
	assert.Equal(t, "decode-0", gone)
	_, ok = s.AnyGone(cluster.RolePrefill)
	assert.False(t, ok)

	require.NoError(t, s.Restart("decode-0"))
	re := next(t, s, "decode-0")
	require.Equal(t, EventReady, re.Event.Event)
	st2 := s.State("decode-0")
	assert.NotEqual(t, pid, st2.Pid, "a new process")
	assert.False(t, st2.Gone)
	// The node writes that line after its ready event: its relay may come
	// later than the event does.
	assert.Eventually(t, func() bool { return strings.Contains(stderr.String(), "decode-0: fake node decode-0 up") },
		time.Minute, 10*time.Millisecond, "stderr is relayed with the node's id: %q", stderr.String())

	s.Stop(30 * time.Second)
	// Ranks first: the rank's row and exit come before the decode's end.
	var order []string
	for len(order) < 2 {
		ev := <-s.Events()
		if ev.Exit {
			order = append(order, ev.ID)
		}
	}
	assert.Equal(t, []string{"g0-r0", "decode-0"}, order)
	rows := s.Rows()
	require.Len(t, rows, 2)
	assert.Equal(t, Row{ID: "decode-0", Role: "decode", Drained: true}, rows[0])
	assert.Equal(t, Row{ID: "g0-r0", Role: "prefill", Batches: 1, Drained: true}, rows[1])
	require.Error(t, s.Restart("decode-0"), "no restart once stopping")
	s.Close()
	_, open := <-s.Events()
	assert.False(t, open, "Close ends Events")
}

// TestSupervisorStopKillsTheStubborn: nodes that ignore their stdin's end
// are killed once the grace ran out, every one of them (the deadline's
// timer fired once: the second was waited for until it exited by itself).
func TestSupervisorStopKillsTheStubborn(t *testing.T) {
	s := NewSupervisor("/bin/sh", nil, nil)
	ids := []string{"g0-r0", "g0-r1", "g0-r2"}
	for _, id := range ids {
		require.NoError(t, s.Start(ChildSpec{ID: id, Role: cluster.RolePrefill, Args: []string{"-c", "trap '' TERM; exec sleep 600 </dev/null"}}))
	}
	stopped := make(chan struct{})
	go func() { s.Stop(200 * time.Millisecond); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Minute): // the nodes sleep 600 s
		t.Fatal("Stop did not kill every stubborn node")
	}
	for _, id := range ids {
		assert.True(t, s.State(id).Gone, id)
	}
	s.Close()
}

// TestSupervisorCutHurriesStop: a cut (up's second signal) ends every node
// at once, also while Stop waits out a long grace for a node's drain: the
// node gets its second stop, and SIGKILL if it ignores it.
func TestSupervisorCutHurriesStop(t *testing.T) {
	s := NewSupervisor("/bin/sh", nil, nil)
	// Ignores its stdin's end and SIGTERM: only the kill ends it.
	require.NoError(t, s.Start(ChildSpec{ID: "decode-0", Role: cluster.RoleDecode, Args: []string{"-c", "trap '' TERM; exec sleep 600 </dev/null"}}))
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s.Stop(10 * time.Minute)
	}()
	s.Cut(100 * time.Millisecond)
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("Stop still waits for the node's 10-minute grace after a cut")
	}
	assert.True(t, s.State("decode-0").Gone)
	require.Error(t, s.Restart("decode-0"), "no restart once cut")
	s.Close()
}
