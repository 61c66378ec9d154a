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

// TestWaitForgetsAnAbandonedWait: a serving stack that polls a room with
// bounded Waits (each ends with its ctx) leaves nothing behind per call:
// the server forgets each waiter when its ctx ends, and a Wait still
// waiting gets the room when it ends.
func TestWaitForgetsAnAbandonedWait(t *testing.T) {
	r := newRig(t, decode.Config{})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	c := r.dial(t)
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))
	for range 100 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := r.srv.Wait(ctx, 7)
		require.True(t, errors.Is(err, context.Canceled), "%v", err)
	}
	assert.Equal(t, 0, decode.WaitersForTest(r.srv, 7), "waiters kept for 100 Waits that ended with their ctx")

	done := make(chan error, 1)
	go func() {
		_, err := r.srv.Wait(waitCtx(t), 7)
		done <- err
	}()
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 2, 4, 4, true, system.Succeeded, nil)))
	require.NoError(t, <-done)
}

// TestWaitEndsWithItsCtxWhileAdmitRuns: a Wait already registered
// returns when its ctx ends, while the server's actor is still inside a
// slow Config.Admit (held until the Wait returned): forgetting the waiter
// is sent to the actor, not waited for. The 30 s bound only turns a hang
// into a failure that says what hung.
func TestWaitEndsWithItsCtxWhileAdmitRuns(t *testing.T) {
	inAdmit, release := make(chan struct{}), make(chan struct{})
	first := true
	r := newRig(t, decode.Config{Admit: func(string, map[string]string) error {
		if first {
			first = false
			close(inAdmit)
			<-release
		}
		return nil
	}})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := r.srv.Wait(ctx, 7)
		waited <- err
	}()
	require.Eventually(t, func() bool { return decode.WaitersForTest(r.srv, 7) == 1 }, 10*time.Second, time.Millisecond)
	dialed := make(chan error, 1)
	go func() {
		c, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0",
			CallTimeout: time.Minute, ConnectTimeout: time.Minute})
		if err == nil {
			_ = c.Close(context.Background())
		}
		dialed <- err
	}()
	<-inAdmit
	cancel()
	select {
	case err := <-waited:
		require.True(t, errors.Is(err, context.Canceled), "%v", err)
	case <-time.After(30 * time.Second):
		close(release)
		released = true
		<-waited
		<-dialed
		t.Fatal("Wait did not return within 30 s of its ctx ending: it waited for the actor, busy in Admit")
	}
	close(release)
	released = true
	require.NoError(t, <-dialed)
}
