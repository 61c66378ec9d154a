package actors

import (
	"context"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// gate is an event the test completes.
type gate struct{ done chan struct{} }

func (g *gate) Wait(ctx context.Context) error {
	select {
	case <-g.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// postOrder runs two requests' chunks that share a forward through a ready
// hub: room 1's middle chunk, registered first, and room 2's last chunk,
// registered second; each has a group Work gated by the forward's group
// event and a Work for its hookless buffers gated by its end event, and
// room 1's Works reach the submitters first. It completes the group event,
// then the end event, and returns the rooms in the order the submitters
// take the Works.
func postOrder(t *testing.T, fifo bool) []uint64 {
	h := newReadyHub(fifo)
	group, end := &gate{make(chan struct{})}, &gate{make(chan struct{})}
	job := func(room, serial uint64, last bool) *Job {
		return NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: room}, Serial: serial}, Range: cp.Range{Last: last}})
	}
	mid, fin := job(1, 1, false), job(2, 2, true)
	woken := make(chan struct{}, 8)
	wake := func() { woken <- struct{}{} }
	for _, x := range []struct {
		j  *Job
		ev messages.Event
	}{{mid, group}, {fin, group}, {mid, end}, {fin, end}} {
		h.add(&Work{Work: messages.Work{Chunk: x.j.ID(), Event: x.ev}, Job: x.j}, time.Now(), wake)
	}
	var order []uint64
	for _, ev := range []*gate{group, end} {
		close(ev.done)
		// The one wait on the event returns and queues both Works; each
		// wake then takes the most urgent.
		for range 2 {
			<-woken
			rw := h.take()
			require.NotNil(t, rw)
			require.NoError(t, rw.wt.err)
			order = append(order, rw.w.Chunk.Room)
		}
	}
	assert.Nil(t, h.take())
	return order
}

// Send order by deadline: the finishing request's batches go first at each
// event, although its Works arrived second.
func TestReadyHubPostsTheFinishingRequestFirst(t *testing.T) {
	assert.Equal(t, []uint64{2, 1, 2, 1}, postOrder(t, false))
}

// The same with the ordering disabled: arrival order, the finishing
// request second. This is what the test above catches.
func TestReadyHubFIFOIsArrivalOrder(t *testing.T) {
	assert.Equal(t, []uint64{1, 2, 1, 2}, postOrder(t, true))
}

// A cancelled Work is queued alone, at once, and leaves the other Works on
// the event waiting; once none is left, the event's wait ends.
func TestReadyHubCancelledWaitAlone(t *testing.T) {
	h := newReadyHub(false)
	ev := &gate{make(chan struct{})}
	woken := make(chan struct{}, 4)
	wake := func() { woken <- struct{}{} }
	a := NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: 1}, Serial: 1}})
	b := NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: 2}, Serial: 2}})
	h.add(&Work{Work: messages.Work{Chunk: a.ID(), Event: ev}, Job: a}, time.Now(), wake)
	h.add(&Work{Work: messages.Work{Chunk: b.ID(), Event: ev}, Job: b}, time.Now(), wake)
	a.Release() // cancels a's context
	<-woken
	got := h.take()
	require.NotNil(t, got)
	assert.Equal(t, uint64(1), got.w.Chunk.Room)
	assert.Error(t, got.wt.err)
	assert.Nil(t, h.take(), "b still waits")
	close(ev.done)
	<-woken
	got = h.take()
	require.NotNil(t, got)
	assert.Equal(t, uint64(2), got.w.Chunk.Room)
	assert.NoError(t, got.wt.err)
	h.mu.Lock()
	assert.Empty(t, h.waits, "the event's wait ended with its last Work")
	h.mu.Unlock()
}

// A wait whose every Work was cancelled ends without the event: a hung
// kernel keeps no goroutine once its chunks gave up.
func TestReadyHubWaitEndsWithItsLastWork(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newReadyHub(false)
	ev := &gate{make(chan struct{})} // never completes
	woken := make(chan struct{}, 4)
	wake := func() { woken <- struct{}{} }
	a := NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: 1}, Serial: 1}})
	h.add(&Work{Work: messages.Work{Chunk: a.ID(), Event: ev}, Job: a}, time.Now(), wake)
	h.mu.Lock()
	ew := h.waits[messages.Event(ev)]
	h.mu.Unlock()
	require.NotNil(t, ew)
	a.Release()
	<-woken
	got := h.take()
	require.NotNil(t, got)
	assert.ErrorIs(t, got.wt.err, context.Canceled)
	h.mu.Lock()
	assert.Empty(t, h.waits)
	h.mu.Unlock()
}

// A job that stopped stays out of the hub: a Work of it whose event ends
// while its stop takes it off (jobStopped let go of the hub's lock between
// taking the job's list and cancelling its Works) does not bring the job
// back, which would keep it, its plan and its pages for ever.
func TestReadyHubForgetsAStoppedJob(t *testing.T) {
	h := newReadyHub(false)
	ev := &gate{make(chan struct{})}
	a := NewJob(&plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: 1}, Serial: 1}})
	rw := h.add(&Work{Work: messages.Work{Chunk: a.ID(), Event: ev}, Job: a}, time.Now(), func() {})
	h.mu.Lock()
	delete(h.jobs, a) // what jobStopped takes first
	h.unwatch(rw)     // what the event's end does meanwhile
	_, back := h.jobs[a]
	h.mu.Unlock()
	assert.False(t, back)
	close(ev.done)
}
