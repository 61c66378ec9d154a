package decode_test

import (
	"context"
	"errors"
	"testing"

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
