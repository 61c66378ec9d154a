package decode_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// departedBound bounds, in these tests, how long a session whose actor went
// away may take to end: its grace (Config.DepartedGrace, 2 s here)
// and its revocation, with room for a loaded machine. It only turns a
// session that never ends into a failure that says so.
const departedBound = 60 * time.Second

// rigWithHeartbeat is newRig on a node whose heartbeats declare a silent
// peer lost within bound, and whose server ends a session whose actor went
// away after the same bound (Config.DepartedGrace).
func rigWithHeartbeat(t *testing.T, bound time.Duration, cfg decode.Config) *rig {
	t.Helper()
	cfg.DepartedGrace = bound
	return newRigOn(t, decode.NodeConfig{Listen: "127.0.0.1:0", Heartbeat: decode.HeartbeatWithin(bound)}, cfg)
}

// sessionEndsLost waits for ss to end, and checks it ended as lost and
// that the server holds no session any more.
func sessionEndsLost(t *testing.T, r *rig, ss *decode.Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), departedBound)
	defer cancel()
	_, err := ss.Wait(ctx)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "the session whose actor went away did not end within %v: %v", departedBound, err)
	require.True(t, errors.Is(err, decode.ErrPrefillLost), "%v", err)
	assert.Contains(t, err.Error(), "went away")
	st, err := r.srv.State()
	require.NoError(t, err)
	assert.Equal(t, 0, st.Sessions, "the session's place is free")
}

// TestGaveUpDialSessionEnds: a Dial that gave up on its Hello (answered
// after its call timeout: a slow Admit) and is followed by no other Dial
// from its node stops its session actor, while the decode opened the
// session. The prefill's node answers heartbeats: the session held a place
// of MaxSessions, the prefill's identity, its access point and its rooms
// for as long as the prefill's process lived. It now ends as lost (its
// access revoked first) once its grace (Config.DepartedGrace) passed.
func TestGaveUpDialSessionEnds(t *testing.T) {
	slow := true
	r := rigWithHeartbeat(t, 2*time.Second, decode.Config{Admit: func(string, map[string]string) error {
		if slow { // only the actor calls Admit
			slow = false
			time.Sleep(3 * call) // the answer comes after the call timeout
		}
		return nil
	}})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	_, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0",
		CallTimeout: call})
	require.Error(t, err, "the Dial gives up on its Hello")
	ss, err := r.srv.Accept(waitCtx(t))
	require.NoError(t, err, "the decode opened the session")
	sessionEndsLost(t, r, ss)

	// The identity is free: the prefill's next Dial gets a session.
	c, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0",
		CallTimeout: 10 * time.Second})
	require.NoError(t, err)
	serveRoom7(t, r, c)
	require.NoError(t, c.Close(waitCtx(t)))
}

// TestAbandonedSessionEnds: a prefill whose session actor stops without
// goodbye while its process (its node's heartbeats) goes on: the session
// ends as lost once its grace passed, and the room it left unfinished
// fails.
func TestAbandonedSessionEnds(t *testing.T) {
	r := rigWithHeartbeat(t, 2*time.Second, decode.Config{})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	c := r.dial(t)
	ss, err := r.srv.Accept(waitCtx(t))
	require.NoError(t, err)
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))
	require.NoError(t, decode.AbandonForTest(c))
	sessionEndsLost(t, r, ss)
	_, err = r.srv.Wait(waitCtx(t), 7)
	assert.True(t, errors.Is(err, decode.ErrPrefillLost), "%v", err)
}
