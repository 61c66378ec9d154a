package decode_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// removingEngine is an engine that can forget a peer (decode.PeerRemover):
// it records the peers removed.
type removingEngine struct {
	mu      sync.Mutex
	added   []string
	removed []string
}

func (e *removingEngine) AddPeer(p plan.Peer) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.added = append(e.added, p.ID)
	return nil
}
func (e *removingEngine) PeerLost(string, error) error      { return nil }
func (e *removingEngine) PeerDraining(string, string) error { return nil }
func (e *removingEngine) CancelRoom(context.Context, string, uint64, string) error {
	return nil
}
func (e *removingEngine) RemovePeer(id string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.removed = append(e.removed, id)
	return nil
}

// TestByeRemovesThePeer: the session's end (Bye, or Close without one)
// removes the decode pool from the engine Attach added it to, once, so that
// a prefill serving ever-new sessions keeps none of the ended ones; the
// system engine is such an engine.
func TestByeRemovesThePeer(t *testing.T) {
	var _ decode.PeerRemover = (*system.Engine)(nil)
	r := newRig(t, decode.Config{})
	for _, bye := range []bool{true, false} {
		c := r.dial(t)
		eng := &removingEngine{}
		require.NoError(t, c.Attach(eng))
		eng.mu.Lock()
		assert.Empty(t, eng.removed, "not before the session ends")
		eng.mu.Unlock()
		if bye {
			_, err := c.Bye(waitCtx(t), nil)
			require.NoError(t, err)
		} else {
			require.NoError(t, c.Close(waitCtx(t)))
		}
		require.NoError(t, c.Close(waitCtx(t)), "a Close after the end is nothing")
		eng.mu.Lock()
		assert.Equal(t, eng.added, eng.removed, "bye=%v: the peer Attach added is removed once", bye)
		eng.mu.Unlock()
	}
}

// idlingEngine is a decode.PeerIdler: RemovePeer is refused while a chunk
// sends to the peer (busy), and PeerIdle's channel closes when that ends.
// With busyAgain, the first RemovePeer after the peer went idle finds a
// chunk registered toward it meanwhile: busy again, refused.
type idlingEngine struct {
	removingEngine
	busy      bool
	busyAgain bool
	idle      chan struct{}
	calls     chan error // every RemovePeer's answer
}

func newIdlingEngine(busyAgain bool) *idlingEngine {
	return &idlingEngine{busy: true, busyAgain: busyAgain, idle: make(chan struct{}), calls: make(chan error, 16)}
}

func (e *idlingEngine) RemovePeer(id string) error {
	e.mu.Lock()
	if !e.busy && e.busyAgain {
		e.busy, e.busyAgain, e.idle = true, false, make(chan struct{})
	}
	busy := e.busy
	e.mu.Unlock()
	err := errors.New("1 live chunks send to it")
	if !busy {
		err = e.removingEngine.RemovePeer(id)
	}
	e.calls <- err
	return err
}

func (e *idlingEngine) PeerIdle(string) <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.idle
}

// finish ends the chunk that sends to the peer.
func (e *idlingEngine) finish() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.busy = false
	close(e.idle)
}

// TestByeRemovesAPeerInUseOnceIdle: a session that ends while chunks still
// send to the decode (a Bye before the serving stack finished its rooms
// there) leaves the peer to be removed once the engine says it is idle,
// and again if a chunk toward it came meanwhile; system.Engine is such an
// engine.
func TestByeRemovesAPeerInUseOnceIdle(t *testing.T) {
	var _ decode.PeerIdler = (*system.Engine)(nil)
	r := newRig(t, decode.Config{})
	for _, busyAgain := range []bool{false, true} {
		c := r.dial(t)
		eng := newIdlingEngine(busyAgain)
		require.NoError(t, c.Attach(eng))
		_, err := c.Bye(waitCtx(t), nil)
		require.NoError(t, err)
		next := func() error {
			t.Helper()
			select {
			case err := <-eng.calls:
				return err
			case <-time.After(time.Minute):
				t.Fatalf("busyAgain=%v: no RemovePeer a minute after the peer went idle", busyAgain)
				return nil
			}
		}
		require.Error(t, next(), "refused at the Bye: busy")
		eng.finish()
		if busyAgain {
			require.Error(t, next(), "refused: busy again")
			eng.finish()
		}
		require.NoError(t, next(), "removed once idle")
		eng.mu.Lock()
		assert.Equal(t, eng.added, eng.removed, "busyAgain=%v", busyAgain)
		eng.mu.Unlock()
	}
}
