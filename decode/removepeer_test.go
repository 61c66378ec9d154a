package decode_test

import (
	"context"
	"sync"
	"testing"

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

// record appends id to one of the engine's lists.
func (e *removingEngine) record(to *[]string, id string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	*to = append(*to, id)
	return nil
}

func (e *removingEngine) AddPeer(p plan.Peer) error         { return e.record(&e.added, p.ID) }
func (e *removingEngine) PeerLost(string, error) error      { return nil }
func (e *removingEngine) PeerDraining(string, string) error { return nil }
func (e *removingEngine) CancelRoom(context.Context, string, uint64, string) error {
	return nil
}
func (e *removingEngine) RemovePeer(id string) error { return e.record(&e.removed, id) }

// idleRemovingEngine can also remove a peer once idle
// (decode.IdlePeerRemover): it records those removals apart.
type idleRemovingEngine struct {
	removingEngine
	whenIdle []string
}

func (e *idleRemovingEngine) RemovePeerWhenIdle(p plan.Peer) error {
	return e.record(&e.whenIdle, p.ID)
}

// TestByeRemovesThePeer: the session's end (Bye, or Close without one)
// removes the decode pool from the engine Attach added it to, once, so that
// a prefill serving ever-new sessions keeps none of the ended ones; the
// system engine is such an engine.
func TestByeRemovesThePeer(t *testing.T) {
	var _ decode.IdlePeerRemover = (*system.Engine)(nil)
	r := newRig(t, decode.Config{})
	for _, idle := range []bool{false, true} {
		for _, bye := range []bool{true, false} {
			c := r.dial(t)
			eng := &idleRemovingEngine{}
			var attached decode.Engine = &eng.removingEngine
			if idle {
				attached = eng
			}
			require.NoError(t, c.Attach(attached))
			eng.mu.Lock()
			assert.Empty(t, eng.removed, "not before the session ends")
			assert.Empty(t, eng.whenIdle, "not before the session ends")
			eng.mu.Unlock()
			if bye {
				_, err := c.Bye(waitCtx(t), nil)
				require.NoError(t, err)
			} else {
				require.NoError(t, c.Close(waitCtx(t)))
			}
			require.NoError(t, c.Close(waitCtx(t)), "a Close after the end is nothing")
			eng.mu.Lock()
			if idle {
				assert.Equal(t, eng.added, eng.whenIdle, "bye=%v: the peer Attach added is removed once, when idle", bye)
				assert.Empty(t, eng.removed, "bye=%v: RemovePeerWhenIdle, not RemovePeer", bye)
			} else {
				assert.Equal(t, eng.added, eng.removed, "bye=%v: the peer Attach added is removed once", bye)
			}
			eng.mu.Unlock()
		}
	}
}
