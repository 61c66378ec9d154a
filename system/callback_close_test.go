package system_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/internal/stacks"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blockedIn reports whether a goroutine whose stack holds frame is blocked
// (not running, runnable or in a system call), and, if state is not empty,
// blocked in that state (runtime.Stack's "[sync.RWMutex.RLock]").
func blockedIn(frame, state string) bool {
	return stacks.Blocked(frame, func(g stacks.Goroutine) bool { return state == "" || g.State == state })
}

// poll waits until cond holds (a condition polled, not a time hoped for).
func poll(cond func() bool) {
	for !cond() {
		time.Sleep(100 * time.Microsecond)
	}
}

// callbackDuringClose runs call (CancelRoom or PeerDraining) on e, whose
// callback waits for proceed and then calls back into e (nested): it
// starts Close while the callback runs, lets the callback call back once
// Close is under way, and returns what the nested call returned. It fails
// the test if the nested call deadlocks (blocked on the engine's read lock
// behind Close, which waits for the call that runs the callback), then
// unblocks the callback so that everything unwinds.
func callbackDuringClose(t *testing.T, e **system.Engine, entered, proceed chan struct{}, nestedErr chan error, abandon chan struct{}, call func() error) error {
	t.Helper()
	called := make(chan error, 1)
	go func() { called <- call() }()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- (*e).Close() }()
	poll(func() bool { return blockedIn("system.(*Engine).Close(", "") })
	close(proceed)
	var nested error
	var deadlocked bool
	// The nested call returns at once (ErrClosed); one that has not after a
	// generous bound is taken as a deadlock too, whatever it blocks on (the
	// goroutine states name only the lock the engine used to take).
	bound := time.Now().Add(30 * time.Second)
	poll(func() bool {
		select {
		case nested = <-nestedErr:
			return true
		default:
		}
		deadlocked = blockedIn("system_test.", "sync.RWMutex.RLock") && blockedIn("system.(*Engine).Close(", "sync.RWMutex.Lock") ||
			time.Now().After(bound)
		return deadlocked
	})
	if deadlocked {
		t.Error("deadlock: the callback's call into the engine waits behind Close, which waits for the call running the callback")
		close(abandon)
		nested = <-nestedErr
	}
	require.NoError(t, <-called)
	require.NoError(t, <-closed)
	return nested
}

// TestRoomCancelledCallbackCallsEngineDuringClose: a WithRoomCancelled
// callback that drops the room (the serving stack abandoning the request)
// while Close is under way gets ErrClosed, and CancelRoom and Close return.
func TestRoomCancelledCallbackCallsEngineDuringClose(t *testing.T) {
	entered, proceed, abandon := make(chan struct{}), make(chan struct{}), make(chan struct{})
	nestedErr := make(chan error, 1)
	var e *system.Engine
	e = stdEngine(t, sim.NoFault, 5*time.Second, system.WithRoomCancelled(func(_ string, room uint64, _ string) {
		close(entered)
		<-proceed
		res := make(chan error, 1)
		go func() { res <- e.Drop(context.Background(), room) }()
		select {
		case err := <-res:
			nestedErr <- err
		case <-abandon:
			go func() { nestedErr <- <-res }() // once the callback returned, Close goes on and the Drop returns
		}
	}))
	err := callbackDuringClose(t, &e, entered, proceed, nestedErr, abandon, func() error {
		return e.CancelRoom(context.Background(), "d", 1, "test")
	})
	assert.ErrorIs(t, err, system.ErrClosed)
}

// TestPeerDrainingCallbackCallsEngineDuringClose: a WithPeerDraining
// callback that registers a chunk (the router trying the request again)
// while Close is under way gets ErrClosed, and PeerDraining and Close
// return.
func TestPeerDrainingCallbackCallsEngineDuringClose(t *testing.T) {
	entered, proceed, abandon := make(chan struct{}), make(chan struct{}), make(chan struct{})
	nestedErr := make(chan error, 1)
	var e *system.Engine
	e = stdEngine(t, sim.NoFault, 5*time.Second, system.WithPeerDraining(func(string, string) {
		close(entered)
		<-proceed
		res := make(chan error, 1)
		go func() {
			_, err := e.Register(context.Background(), stdSpec(2))
			res <- err
		}()
		select {
		case err := <-res:
			nestedErr <- err
		case <-abandon:
			go func() { nestedErr <- <-res }()
		}
	}))
	err := callbackDuringClose(t, &e, entered, proceed, nestedErr, abandon, func() error {
		return e.PeerDraining("d", "test")
	})
	assert.ErrorIs(t, err, system.ErrClosed)
}
