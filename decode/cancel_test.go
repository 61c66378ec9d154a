package decode_test

import (
	"context"
	"errors" // the standard library's: every error of the package answers it
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/system"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// dropEngine is the prefill engine as Attach sees it: it records the rooms
// it was told to cancel and the peer that asked, and holds each CancelRoom
// until release is closed (a group in flight still landing), then returns
// err.
type dropEngine struct {
	release chan struct{}
	entered chan uint64 // when set, told of each call as it begins
	err     error
	mu      sync.Mutex
	dropped []uint64
	peers   []string
}

func (e *dropEngine) AddPeer(plan.Peer) error           { return nil }
func (e *dropEngine) PeerLost(string, error) error      { return nil }
func (e *dropEngine) PeerDraining(string, string) error { return nil }
func (e *dropEngine) CancelRoom(_ context.Context, peer string, room uint64, _ string) error {
	if e.entered != nil {
		e.entered <- room
	}
	<-e.release
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropped = append(e.dropped, room)
	e.peers = append(e.peers, peer)
	return e.err
}

// cancels reads kvstream_decode_cancels_total by direction.
func cancels(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "kvstream_decode_cancels_total" {
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestDecodeCancelsARoom: Server.Cancel fails the room (ErrCancelled), tells the prefill, whose engine drops the room (Attach),
// and returns only once the prefill answered that no write of it can land:
// then, and not before, its pages go to another room. The cancel is
// counted by direction.
func TestDecodeCancelsARoom(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := decode.NewMetrics(reg)
	require.NoError(t, err)
	ended := make(chan error, 1)
	r := newRig(t, decode.Config{Observer: m, OnRoomEnd: func(room decode.Room, err error) {
		if room.ID == 7 {
			ended <- err
		}
	}})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	c := r.dial(t)
	eng := &dropEngine{release: make(chan struct{})}
	require.NoError(t, c.Attach(eng))
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))

	cancelled := make(chan error, 1)
	go func() { cancelled <- r.srv.Cancel(waitCtx(t), 7, "its client went away") }()
	require.True(t, errors.Is(<-ended, decode.ErrCancelled), "the room fails at once")
	// The prefill's Drop has not returned: the pages stay out.
	err = r.srv.Expect(8, []int{4, 5, 6, 7})
	require.Error(t, err)
	assert.True(t, errors.Is(err, decode.ErrNotQuiesced), "%v", err)
	select {
	case err := <-cancelled:
		t.Fatalf("Cancel returned before the prefill's writes stopped: %v", err)
	default:
	}
	close(eng.release)
	select {
	case err := <-cancelled:
		require.NoError(t, err)
	case <-waitCtx(t).Done():
		t.Fatal("Cancel did not return once the prefill answered")
	}
	eng.mu.Lock()
	assert.Equal(t, []uint64{7}, eng.dropped)
	assert.Equal(t, []string{c.Peer().ID}, eng.peers, "the engine cancels the room toward this decode only")
	eng.mu.Unlock()
	require.NoError(t, r.srv.Expect(8, []int{4, 5, 6, 7}), "the pages are free again")
	assert.Equal(t, map[string]float64{"decode": 1, "prefill": 0}, cancels(t, reg))

	// One outcome: a second cancel, and the prefill's late last chunk.
	err = r.srv.Cancel(waitCtx(t), 7, "again")
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	err = c.Notify(waitCtx(t), notice(7, 2, 4, 4, true, system.Succeeded, nil))
	assert.Error(t, err, "the room is cancelled: its late chunk is refused")
}

// TestDecodeCancelNotQuietUnlessDropped: the prefill answers that its
// writes stopped only when its engine's CancelRoom returned nil; an engine
// that failed otherwise (closed, or any error not marked ErrNotQuiesced)
// keeps the room's pages out.
func TestDecodeCancelNotQuietUnlessDropped(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	r := newRig(t, decode.Config{Log: zap.New(core)})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	c := r.dial(t)
	eng := &dropEngine{release: make(chan struct{}), err: errors.New("the engine did not answer within 5s (a bug)")}
	close(eng.release)
	require.NoError(t, c.Attach(eng))
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))

	ctx, cancel := context.WithCancel(waitCtx(t))
	cancelled := make(chan error, 1)
	go func() { cancelled <- r.srv.Cancel(ctx, 7, "evicted") }()
	// Wait for the prefill's answer to be taken.
	wait := waitCtx(t)
	for logs.FilterMessage("cancelled room: the prefill could not stop its writes").Len() == 0 {
		select {
		case <-wait.Done():
			t.Fatal("the prefill did not answer that its writes could not be stopped")
		case <-time.After(time.Millisecond):
		}
	}
	err := r.srv.Expect(8, []int{4, 5, 6, 7})
	require.Error(t, err)
	assert.True(t, errors.Is(err, decode.ErrNotQuiesced), "the pages stay out: %v", err)
	cancel()
	assert.True(t, errors.Is(<-cancelled, decode.ErrNotQuiesced))
}

// TestDecodeCancelOfARoomExpectedAgain: a Cancel waits for the room it
// cancelled, not for its id: room 7 is cancelled (its prefill slow to
// answer), Expected again, reported in and cancelled again; the first
// room settling returns the first Cancel only, and the second returns once
// the prefill answered the second cancel, with its pages free.
func TestDecodeCancelOfARoomExpectedAgain(t *testing.T) {
	ended := make(chan error, 2)
	r := newRig(t, decode.Config{OnRoomEnd: func(room decode.Room, err error) {
		if room.ID == 7 {
			ended <- err
		}
	}})
	c := r.dial(t)
	eng := &dropEngine{release: make(chan struct{}), entered: make(chan uint64, 2)}
	require.NoError(t, c.Attach(eng))

	require.NoError(t, r.srv.Expect(7, []int{4, 5}))
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))
	first := make(chan error, 1)
	go func() { first <- r.srv.Cancel(waitCtx(t), 7, "evicted") }()
	require.True(t, errors.Is(<-ended, decode.ErrCancelled))
	require.Equal(t, uint64(7), <-eng.entered, "the prefill's engine is cancelling the first room")

	require.NoError(t, r.srv.Expect(7, []int{0, 1}), "released at once: its id may be Expected again")
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 0, false, system.Succeeded, nil)))
	second := make(chan error, 1)
	go func() { second <- r.srv.Cancel(waitCtx(t), 7, "evicted again") }()
	require.True(t, errors.Is(<-ended, decode.ErrCancelled))

	eng.release <- struct{}{} // the first cancel is answered
	require.NoError(t, <-first)
	require.NoError(t, r.srv.Expect(8, []int{4, 5}), "the first room's pages are free")
	require.Equal(t, uint64(7), <-eng.entered, "the prefill's engine is cancelling the second room")
	select {
	case err := <-second:
		t.Fatalf("the second Cancel returned (%v) before the prefill answered it", err)
	default:
	}
	err := r.srv.Expect(9, []int{0, 1})
	require.Error(t, err)
	assert.True(t, errors.Is(err, decode.ErrNotQuiesced), "the second room's pages are still out: %v", err)

	eng.release <- struct{}{}
	require.NoError(t, <-second)
	require.NoError(t, r.srv.Expect(9, []int{0, 1}), "the second room's pages are free")
}

// TestPrefillCancelsARoom: the prefill's Cancel (after its engine's Drop
// returned) fails the room on the decode side (ErrCancelled), counted by
// direction; Release then frees its pages at once. A room that completed
// first stays complete, and the decode's cancel of it changes nothing.
func TestPrefillCancelsARoom(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := decode.NewMetrics(reg)
	require.NoError(t, err)
	r := newRig(t, decode.Config{Observer: m})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	require.NoError(t, r.srv.Expect(9, []int{0, 1}))
	c := r.dial(t)
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))
	require.NoError(t, c.Cancel(waitCtx(t), 7, "its client aborted", nil))
	_, err = r.srv.Wait(waitCtx(t), 7)
	require.True(t, errors.Is(err, decode.ErrCancelled), "%v", err)
	assert.Contains(t, err.Error(), "cancelled by the prefill p0: its client aborted")
	require.NoError(t, r.srv.Release(7))
	require.NoError(t, r.srv.Expect(8, []int{4, 5, 6, 7}), "quiet: the pages are free at once")
	assert.Equal(t, map[string]float64{"decode": 0, "prefill": 1}, cancels(t, reg))

	// Completed first: the cancels that crossed it change nothing.
	require.NoError(t, c.Notify(waitCtx(t), notice(9, 0, 2, 0, true, system.Succeeded, nil)))
	require.NoError(t, c.Cancel(waitCtx(t), 9, "too late", nil))
	err = r.srv.Cancel(waitCtx(t), 9, "too late")
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	assert.Contains(t, err.Error(), "already ended (complete)")
	room, err := r.srv.Wait(waitCtx(t), 9)
	require.NoError(t, err)
	assert.True(t, room.Complete)
	assert.Equal(t, map[string]float64{"decode": 0, "prefill": 1}, cancels(t, reg))
}

// BenchmarkServerCancel is the decode side's cancel of a room one prefill
// reported in, from the call to the pages back in the pool: the Cancel to
// the prefill, its engine's Drop (here one that returns at once: nothing
// in flight), its answer. In one process over the loopback; a real Drop
// adds up to one group's transfer.
func BenchmarkServerCancel(b *testing.B) {
	r := newRig(b, decode.Config{})
	c, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0"})
	require.NoError(b, err)
	defer c.Close(context.Background())
	eng := &dropEngine{release: make(chan struct{})}
	close(eng.release)
	require.NoError(b, c.Attach(eng))
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		room := uint64(i + 1)
		b.StopTimer()
		require.NoError(b, r.srv.Expect(room, []int{4, 5, 6, 7}))
		require.NoError(b, c.Notify(ctx, notice(room, 0, 2, 4, false, system.Succeeded, nil)))
		b.StartTimer()
		require.NoError(b, r.srv.Cancel(ctx, room, "bench"))
	}
}
