package decode_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// call is the prefill's call timeout in these tests.
const call = 500 * time.Millisecond

// lateAnswerRig is a decode server, room 7 Expected, whose first Admit
// (and so its answer to the first Hello) takes three call timeouts, as a
// pool sized by a large Config.Size can.
func lateAnswerRig(t *testing.T) *rig {
	slow := true
	r := newRig(t, decode.Config{Admit: func(string, map[string]string) error {
		if slow { // only the actor calls Admit
			slow = false
			time.Sleep(3 * call) // the answer comes after the call timeout
		}
		return nil
	}})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	return r
}

// TestLateOfferLeavesNoSession: a decode slow to answer a Hello (here its
// Admit, as a pool sized by a large Config.Size can be) answers after the
// prefill's call timeout; Dial says Hello again and gets the session that
// first Hello opened. Refused as a second session of the identity, it
// failed, and the session it left open held the prefill's identity for as
// long as the prefill's node answered heartbeats: no Dial of that prefill
// got through again.
func TestLateOfferLeavesNoSession(t *testing.T) {
	r := lateAnswerRig(t)
	c, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0",
		CallTimeout: call, ConnectTimeout: 10 * time.Second})
	require.NoError(t, err, "Dial after a late answer to its first Hello")
	st, err := r.srv.State()
	require.NoError(t, err)
	assert.Equal(t, 1, st.Sessions, "one session, the one the first Hello opened")
	serveRoom7(t, r, c)
}

// TestDialThatGaveUpLeavesNoLockout: a Dial with no connect timeout gives
// up on a Hello answered after its call timeout and stops its session
// actor, while the decode opens the session. The prefill's node answers
// heartbeats, so only its actor's end says the session is gone: the next
// Dial, from another actor on that node, ends it (its access revoked
// first) and gets a session of its own. It was refused as a second session
// of the identity for as long as the prefill's process lived.
func TestDialThatGaveUpLeavesNoLockout(t *testing.T) {
	r := lateAnswerRig(t)
	cfg := decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0", CallTimeout: call}
	_, err := decode.Dial(context.Background(), r.node, cfg)
	require.Error(t, err, "the first Dial gives up on its Hello")

	cfg.CallTimeout, cfg.ConnectTimeout = 10*time.Second, 10*time.Second
	c, err := decode.Dial(context.Background(), r.node, cfg)
	require.NoError(t, err, "a later Dial of the prefill gets a session")
	for ctx := waitCtx(t); ; {
		st, err := r.srv.State()
		require.NoError(t, err)
		if st.Sessions == 1 {
			break // the first Dial's session ended
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d sessions: the first Dial's session did not end", st.Sessions)
		case <-time.After(10 * time.Millisecond):
		}
	}
	serveRoom7(t, r, c)
}

// serveRoom7 has the session c complete room 7 (its one chunk) on r and
// say goodbye: the session serves.
func serveRoom7(t *testing.T, r *rig, c *decode.Client) {
	t.Helper()
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 4, 4, true, system.Succeeded, nil)))
	room, err := r.srv.Wait(waitCtx(t), 7)
	require.NoError(t, err)
	assert.True(t, room.Complete)
	_, err = c.Bye(waitCtx(t), nil)
	require.NoError(t, err)
}
