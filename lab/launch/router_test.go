package launch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeCluster is what the router sees of a cluster without processes:
// batches that end on their own shortly after they start.
type fakeCluster struct {
	book *book

	mu      sync.Mutex
	live    []string
	gone    map[string]bool
	running map[string]int // batches in flight per instance
	maxRun  map[string]int
	started []string // instance per batch, in start order
	stopWhy string
	// syncFirst batches end within start.
	syncFirst int
	notes     []string
	waitings  []string
}

func newFakeCluster(live ...string) *fakeCluster {
	return &fakeCluster{book: newBook(1, 1), live: live, gone: map[string]bool{}, running: map[string]int{}, maxRun: map[string]int{}}
}

func (f *fakeCluster) router(decodes ...string) *router {
	return &router{
		decodes: decodes,
		live: func() ([]string, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return append([]string(nil), f.live...), nil
		},
		running: func(id string) bool { f.mu.Lock(); defer f.mu.Unlock(); return !f.gone[id] },
		stop:    func() string { f.mu.Lock(); defer f.mu.Unlock(); return f.stopWhy },
		start: func(b int, dec string) *batch {
			bt := f.book.start(b, dec)
			f.mu.Lock()
			f.started = append(f.started, dec)
			f.running[dec]++
			f.maxRun[dec] = max(f.maxRun[dec], f.running[dec])
			f.mu.Unlock()
			end := func() {
				f.mu.Lock()
				f.running[dec]--
				f.mu.Unlock()
				f.book.rankReported(Event{Event: EventBatch, Batch: b, OK: true})
				f.book.roomEnded(dec, Event{Event: EventRoom, Batch: b, Complete: true})
			}
			if b < f.syncFirst {
				// Ended before the router's next step: the batch's
				// goroutine then shares nothing with the loop but what
				// the router gives it.
				end()
				return bt
			}
			// The batch's rank and room report from elsewhere, later.
			go func() {
				time.Sleep(time.Duration(b%3) * time.Millisecond)
				end()
			}()
			return bt
		},
		await: func(hard context.Context, bt *batch) {
			select {
			case <-bt.done:
			case <-hard.Done():
			}
		},
		note: func(format string, args ...any) {
			f.mu.Lock()
			f.notes = append(f.notes, fmt.Sprintf(format, args...))
			f.mu.Unlock()
		},
		waiting:  func(what string) { f.mu.Lock(); f.waitings = append(f.waitings, what); f.mu.Unlock() },
		pickWait: time.Minute,
		poll:     time.Millisecond,
	}
}

// TestRouterOneBatchPerInstance: batches go to the instances in turn, an
// instance runs one batch at a time while the others run theirs, and
// every batch completes. Run under -race, this is also the test of the
// router's slots: the batches' goroutines, started before the loop adds
// an instance's slot, never touch the map the loop writes (before the
// fix, each read busy[dec] while the loop assigned busy[other]: a data
// race the detector reports here).
func TestRouterOneBatchPerInstance(t *testing.T) {
	decodes := []string{"decode-0", "decode-1", "decode-2", "decode-3"}
	f := newFakeCluster(decodes...)
	f.syncFirst = len(decodes)
	ctx := context.Background()
	started, why := f.router(decodes...).run(ctx, ctx, 40)
	assert.Equal(t, 40, started)
	assert.Empty(t, why)
	rows, complete := f.book.rows(40)
	assert.True(t, complete)
	require.Len(t, rows, 40)
	for b, r := range rows {
		assert.Equal(t, decodes[b%4], r.Decode, "batch %d", b)
	}
	for _, d := range decodes {
		assert.Equal(t, 1, f.maxRun[d], "%s ran more than one batch at a time", d)
	}
}

// TestRouterWaitsForARestart: while the intended instance's process runs
// but is not registered yet, its batch waits for it (saying so); once its
// process is gone for good, batches go to the live ones.
func TestRouterWaitsForARestart(t *testing.T) {
	f := newFakeCluster("decode-0")
	r := f.router("decode-0", "decode-1")
	r.poll = 5 * time.Millisecond
	// decode-1 registers again once the router said it waits for it, not
	// after a sleep that a starved test could outlast before it picks.
	said := make(chan struct{}, 1)
	waiting := r.waiting
	r.waiting = func(what string) {
		waiting(what)
		select {
		case said <- struct{}{}:
		default:
		}
	}
	go func() {
		<-said
		f.mu.Lock()
		f.live = []string{"decode-0", "decode-1"}
		f.mu.Unlock()
	}()
	dec, err := r.pick(context.Background(), 1)
	require.NoError(t, err)
	assert.Equal(t, "decode-1", dec, "the batch waited for its instance")
	assert.NotEmpty(t, f.waitings, "the wait was said")
	assert.Contains(t, f.waitings[0], "waits for decode instance decode-1")

	f.mu.Lock()
	f.live, f.gone["decode-1"] = []string{"decode-0"}, true
	f.mu.Unlock()
	dec, err = r.pick(context.Background(), 1)
	require.NoError(t, err)
	assert.Equal(t, "decode-0", dec, "a gone instance's batch goes to a live one")

	f.mu.Lock()
	f.live = nil
	f.mu.Unlock()
	r.pickWait = 20 * time.Millisecond
	_, err = r.pick(context.Background(), 0)
	assert.ErrorContains(t, err, "no live decode instance")
}

// TestRouterStops: a reason to stop (a rank gone) and the drain (accept
// ended) start no more batches, and say so; the started ones still end.
func TestRouterStops(t *testing.T) {
	f := newFakeCluster("decode-0")
	r := f.router("decode-0")
	inner := r.start
	r.start = func(b int, dec string) *batch {
		if b == 2 {
			f.mu.Lock()
			f.stopWhy = "rank g0-r1 is gone"
			f.mu.Unlock()
		}
		return inner(b, dec)
	}
	ctx := context.Background()
	started, why := r.run(ctx, ctx, 10)
	assert.Equal(t, 3, started)
	assert.Equal(t, "rank g0-r1 is gone", why)
	assert.Contains(t, f.notes, "batch 3 and later not started: rank g0-r1 is gone")

	f = newFakeCluster("decode-0")
	r = f.router("decode-0")
	accept, drain := context.WithCancel(ctx)
	inner = r.start
	r.start = func(b int, dec string) *batch {
		if b == 1 {
			drain()
		}
		return inner(b, dec)
	}
	started, why = r.run(accept, ctx, 10)
	assert.Equal(t, 2, started)
	assert.Equal(t, "draining", why)
	assert.Zero(t, f.book.open(), "the started batches ended")
}

// TestRouterAvoidsADrainingInstance: while an instance is drained on
// purpose (a rolling restart) no batch goes to it, though it is live and
// its process runs; once it is no longer avoided it gets its turn again.
func TestRouterAvoidsADrainingInstance(t *testing.T) {
	decodes := []string{"decode-0", "decode-1"}
	f := newFakeCluster(decodes...)
	r := f.router(decodes...)
	var mu sync.Mutex
	avoid := "decode-0"
	r.avoid = func(id string) bool { mu.Lock(); defer mu.Unlock(); return id == avoid }
	ctx := context.Background()
	started, why := r.run(ctx, ctx, 6)
	assert.Equal(t, 6, started)
	assert.Empty(t, why)
	f.mu.Lock()
	assert.Equal(t, []string{"decode-1", "decode-1", "decode-1", "decode-1", "decode-1", "decode-1"}, f.started)
	f.mu.Unlock()
	rows, complete := f.book.rows(6)
	assert.True(t, complete, "%+v", rows)

	mu.Lock()
	avoid = ""
	mu.Unlock()
	dec, err := r.pick(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, "decode-0", dec)
}
