package decode_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/system"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The waits of Close, Drain, Wait and Cancel are bounded by their ctx, also
// while the server's actor is inside a slow Config callback (Admit here).
// Each test holds Admit until the call under test returned: a call that
// waited for the actor would not return before its 30 s bound, which only
// turns that hang into a failure that says what hung.

// busyServer is a server whose actor is inside Config.Admit, held until
// release is called (at the latest when the test ends), for a Dial that
// then goes on.
type busyServer struct {
	*rig
	release func()
	dialed  func() error // the Dial's outcome, once it returned
}

func newBusyServer(t *testing.T, cfg decode.Config) *busyServer {
	t.Helper()
	inAdmit, held := make(chan struct{}), make(chan struct{})
	first := true
	cfg.Admit = func(string, map[string]string) error {
		if first { // only the actor calls Admit
			first = false
			close(inAdmit)
			<-held
		}
		return nil
	}
	b := &busyServer{rig: newRig(t, cfg)}
	dialed := make(chan error, 1)
	b.dialed = sync.OnceValue(func() error { return <-dialed })
	released := false
	b.release = func() {
		if !released {
			released = true
			close(held)
		}
	}
	// Registered after newRig's: runs before it (the server's Close).
	t.Cleanup(func() {
		b.release()
		_ = b.dialed()
	})
	require.NoError(t, b.srv.Expect(7, []int{4, 5, 6, 7}))
	go func() {
		c, err := decode.Dial(context.Background(), b.node, decode.DialConfig{Decode: b.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0",
			CallTimeout: time.Minute, ConnectTimeout: time.Minute})
		if err == nil {
			_ = c.Close(context.Background())
		}
		dialed <- err
	}()
	<-inAdmit
	return b
}

// returnsWithin runs call with a ctx that ends after 100 ms and returns its
// error, failing the test when it did not return within 30 s while the
// actor was still held in Admit.
func (b *busyServer) returnsWithin(t *testing.T, what string, call func(context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		b.release()
		<-done
		t.Fatalf("%s did not return within 30 s of its ctx ending: it waited for the actor, busy in Admit", what)
		return nil
	}
}

// TestCloseReturnsWithinCtxDuringAdmit: Close returns when its ctx ends,
// its error ctx's and marked ErrNotQuiesced (the sessions are not cut
// off yet); once Admit returns, the server still closes: the session the
// Hello opened ends closed, and the actor stops.
func TestCloseReturnsWithinCtxDuringAdmit(t *testing.T) {
	b := newBusyServer(t, decode.Config{})
	err := b.returnsWithin(t, "Close", b.srv.Close)
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.True(t, errors.Is(err, decode.ErrNotQuiesced), "%v", err)

	b.release()
	_ = b.dialed()
	for ctx := waitCtx(t); ; {
		_, err := b.srv.State()
		if errors.Is(err, decode.ErrClosed) {
			break // the actor stopped, after the CloseMsg queued behind Admit
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the server's actor did not stop once Admit returned: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	assert.NoError(t, b.srv.Close(waitCtx(t)), "a second Close")
}

// TestDrainReturnsWithinCtxDuringAdmit: Drain returns when its ctx ends;
// the server drains once Admit returns all the same.
func TestDrainReturnsWithinCtxDuringAdmit(t *testing.T) {
	b := newBusyServer(t, decode.Config{})
	err := b.returnsWithin(t, "Drain", b.srv.Drain)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	b.release()
	_ = b.dialed() // the Hello came before the drain: it may get its session
	st, err := b.srv.State()
	require.NoError(t, err)
	assert.True(t, st.Draining, "the drain asked for is taken once the actor is free")
}

// TestWaitReturnsWithinCtxDuringAdmit: a Wait whose first lookup the actor
// has not taken when its ctx ends returns ctx's error, and the lookup,
// never run, leaves no waiter behind.
func TestWaitReturnsWithinCtxDuringAdmit(t *testing.T) {
	b := newBusyServer(t, decode.Config{})
	err := b.returnsWithin(t, "Wait", func(ctx context.Context) error {
		_, err := b.srv.Wait(ctx, 7)
		return err
	})
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	b.release()
	require.NoError(t, b.dialed())
	assert.Equal(t, 0, decode.WaitersForTest(b.srv, 7), "an abandoned lookup registered a waiter")
}

// TestCancelReturnsWithinCtxDuringAdmit: a Cancel the actor has not taken
// when its ctx ends returns ctx's error, not marked ErrNotQuiesced, and
// changes nothing: the room is still there, not cancelled, once the
// actor is free.
func TestCancelReturnsWithinCtxDuringAdmit(t *testing.T) {
	ended := make(chan error, 1)
	b := newBusyServer(t, decode.Config{OnRoomEnd: func(room decode.Room, err error) { ended <- err }})
	err := b.returnsWithin(t, "Cancel", func(ctx context.Context) error { return b.srv.Cancel(ctx, 7, "evicted") })
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.False(t, errors.Is(err, decode.ErrNotQuiesced), "nothing was cancelled: %v", err)
	b.release()
	require.NoError(t, b.dialed())
	_, err = b.srv.State() // the actor took what reached it before
	require.NoError(t, err)
	select {
	case err := <-ended:
		t.Fatalf("the room ended (%v): the abandoned Cancel ran", err)
	default:
	}
	require.NoError(t, b.srv.Release(7), "room 7 is still there")
}

// cancelSeconds reads kvstream_decode_cancel_seconds' sample count.
func cancelSeconds(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "kvstream_decode_cancel_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no kvstream_decode_cancel_seconds")
	return 0
}

// TestCancelSettledObservedWhenItsCallerGaveUp: a Server.Cancel whose ctx
// ended before the prefill answered is observed in
// kvstream_decode_cancel_seconds when its room settles all the same: the
// histogram counts every cancel from the decode side, as
// kvstream_decode_cancels_total{direction="decode"} does.
func TestCancelSettledObservedWhenItsCallerGaveUp(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := decode.NewMetrics(reg)
	require.NoError(t, err)
	ended := make(chan error, 2)
	r := newRig(t, decode.Config{Observer: m, OnRoomEnd: func(room decode.Room, err error) {
		if room.ID == 7 {
			ended <- err
		}
	}})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	c := r.dial(t)
	eng := &dropEngine{release: make(chan struct{}), entered: make(chan uint64, 1)}
	require.NoError(t, c.Attach(eng))
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))

	ctx, cancel := context.WithCancel(waitCtx(t))
	cancelled := make(chan error, 1)
	go func() { cancelled <- r.srv.Cancel(ctx, 7, "evicted") }()
	require.True(t, errors.Is(<-ended, decode.ErrCancelled))
	require.Equal(t, uint64(7), <-eng.entered, "the prefill's engine is dropping the room")
	cancel()
	err = <-cancelled
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
	require.True(t, errors.Is(err, decode.ErrNotQuiesced), "%v", err)

	close(eng.release) // the prefill answers: the room settles
	for wait := waitCtx(t); r.srv.Expect(8, []int{4, 5, 6, 7}) != nil; {
		select {
		case <-wait.Done():
			t.Fatal("the cancelled room's pages did not come back")
		case <-time.After(10 * time.Millisecond):
		}
	}
	assert.Equal(t, map[string]float64{"decode": 1, "prefill": 0}, cancels(t, reg))
	assert.Equal(t, uint64(1), cancelSeconds(t, reg), "the settlement of a cancel whose caller gave up is observed")

	// A Cancel that waits for its room is observed once.
	require.NoError(t, c.Notify(waitCtx(t), notice(8, 0, 2, 4, false, system.Succeeded, nil)))
	require.NoError(t, r.srv.Cancel(waitCtx(t), 8, "evicted"))
	assert.Equal(t, map[string]float64{"decode": 2, "prefill": 0}, cancels(t, reg))
	assert.Equal(t, uint64(2), cancelSeconds(t, reg))
}
