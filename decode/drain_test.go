package decode_test

import (
	"context"
	"errors" // the standard library's: every error of the package answers it
	"sync"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// drainEngine is the prefill engine as Attach sees it: it records what it
// was told.
type drainEngine struct {
	mu       sync.Mutex
	draining []string
	told     chan struct{}
}

func (e *drainEngine) AddPeer(plan.Peer) error      { return nil }
func (e *drainEngine) PeerLost(string, error) error { return nil }
func (e *drainEngine) CancelRoom(context.Context, string, uint64, string) error {
	return nil
}
func (e *drainEngine) PeerDraining(id, reason string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.draining = append(e.draining, id+": "+reason)
	close(e.told)
	return nil
}

// TestDrainWindsTheSessionDown: a draining server tells its open session
// (the prefill's engine hears of it through Attach, the serving stack
// through OnDrain), refuses new sessions, lets the room in flight complete,
// and its Drain returns as soon as the prefill said goodbye, with the
// session complete.
func TestDrainWindsTheSessionDown(t *testing.T) {
	r := newRig(t, decode.Config{})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	c := r.dial(t)
	eng := &drainEngine{told: make(chan struct{})}
	require.NoError(t, c.Attach(eng))
	heard := make(chan string, 1)
	c.OnDrain(func(reason string) { heard <- reason })
	assert.Empty(t, c.Draining())
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))

	drained := make(chan error, 1)
	go func() { drained <- r.srv.Drain(context.Background()) }()
	select {
	case reason := <-heard:
		assert.Contains(t, reason, "draining")
	case <-waitCtx(t).Done():
		t.Fatal("the prefill was not told of the drain")
	}
	<-eng.told
	eng.mu.Lock()
	assert.Equal(t, []string{"decode: " + c.Draining()}, eng.draining)
	eng.mu.Unlock()
	late := make(chan string, 1)
	c.OnDrain(func(reason string) { late <- reason })
	assert.Equal(t, c.Draining(), <-late, "OnDrain after the drain is called at once")

	// No new session while it drains.
	_, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p1"})
	assert.True(t, errors.Is(err, decode.ErrUnavailable), "%v", err)

	// The session is open: the drain waits for it.
	select {
	case err := <-drained:
		t.Fatalf("Drain returned while a session was open: %v", err)
	default:
	}
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 2, 4, 4, true, system.Succeeded, nil)))
	room, err := r.srv.Wait(waitCtx(t), 7)
	require.NoError(t, err)
	assert.True(t, room.Complete)
	sessions := acceptAll(t, r.srv, 1)
	_, err = c.Bye(waitCtx(t), nil)
	require.NoError(t, err)
	select {
	case err := <-drained:
		require.NoError(t, err)
	case <-waitCtx(t).Done():
		t.Fatal("Drain did not return once the session ended")
	}
	rep, err := sessions[0].Wait(waitCtx(t))
	require.NoError(t, err)
	assert.True(t, rep.Complete, "%+v", rep)
}

// acceptAll takes n sessions the server accepted.
func acceptAll(t *testing.T, srv *decode.Server, n int) []*decode.Session {
	t.Helper()
	var out []*decode.Session
	for range n {
		ss, err := srv.Accept(waitCtx(t))
		require.NoError(t, err)
		out = append(out, ss)
	}
	return out
}
