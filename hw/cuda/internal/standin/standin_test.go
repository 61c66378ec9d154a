package standin

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The queue hands work over in launch order, puts back what was not
// reached ahead of newer work, and once stopped keeps its first error:
// Push returns it, Take hands over what is left with it.
func TestQueue(t *testing.T) {
	q := NewQueue[int]()
	require.Equal(t, uint64(1), q.NextSeq())
	require.Equal(t, uint64(2), q.NextSeq())
	require.NoError(t, q.Push(1))
	require.NoError(t, q.Push(2))
	q.Wait() // a push since the last Wait: returns at once
	batch, err := q.Take(nil)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, batch)
	require.NoError(t, q.Push(3))
	q.PushFront(batch[1:])
	batch, err = q.Take(batch)
	require.NoError(t, err)
	require.Equal(t, []int{2, 3}, batch)

	require.NoError(t, q.Push(4))
	closed := errors.New("closed")
	require.True(t, q.Stop(closed))
	require.False(t, q.Stop(errors.New("again")), "the first stop's error stays")
	require.ErrorIs(t, q.Push(5), closed)
	require.ErrorIs(t, q.Err(), closed)
	batch, err = q.Take(nil)
	require.ErrorIs(t, err, closed)
	require.Equal(t, []int{4}, batch)
	require.Empty(t, q.Drain())
}

// An event completes or fails once, whichever comes first; a wait that
// ends with its context names the stand-in, the event and the stream.
func TestEvent(t *testing.T) {
	var e Event
	e.Init("cpu", "compute", 7)
	ok, err := e.Query()
	require.NoError(t, err)
	require.False(t, ok)
	_, done := e.CompletedAt()
	require.False(t, done)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = e.Wait(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "cpu: wait for event 7 on stream compute")

	at := time.Unix(100, 0)
	e.Reach(at)
	e.Fail(errors.New("too late"))
	require.NoError(t, e.Wait(context.Background()))
	got, done := e.CompletedAt()
	require.True(t, done)
	require.Equal(t, at, got)

	var f Event
	f.Init("sim", "compute", 1)
	lost := errors.New("lost")
	f.Fail(lost)
	f.Reach(at)
	_, err = f.Query()
	require.ErrorIs(t, err, lost)
	require.ErrorIs(t, f.Wait(context.Background()), lost)
	_, done = f.CompletedAt()
	require.False(t, done)
}
