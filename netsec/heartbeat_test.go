package netsec

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
)

func TestWatchHeartbeatsRefusesBadConfig(t *testing.T) {
	peer := actor.NewPID("127.0.0.1:1", HeartbeatActor)
	lost := func(error) {}
	for cfg, want := range map[HeartbeatConfig]string{
		{Interval: 0, Misses: 3}:                 "Interval 0s",
		{Interval: -time.Second, Misses: 3}:      "Interval -1s",
		{Interval: time.Second, Misses: 0}:       "Misses 0",
		{Interval: time.Second, Misses: 1 << 20}: "Misses 1048576",
	} {
		_, err := WatchHeartbeats(fx.n.system, peer, cfg, lost)
		require.ErrorContains(t, err, want)
	}
	_, err := WatchHeartbeats(fx.n.system, nil, HeartbeatConfig{Interval: time.Second, Misses: 3}, lost)
	require.Error(t, err)
	require.Equal(t, 700*time.Millisecond, HeartbeatConfig{Interval: 100 * time.Millisecond, Misses: 6}.Bound())
}

// TestSilenceNeedsTheMonitorsOwnTicks: a loss needs both the wall-clock
// silence and as many of the monitor's own ticks (pings sent unanswered):
// a monitor that was itself starved of CPU for the whole bound, and so
// ticked once, does not blame its peer; one that ran and heard nothing
// does, within Bound().
func TestSilenceNeedsTheMonitorsOwnTicks(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 100 * time.Millisecond, Misses: 6}
	// Starved: 5 s of wall time, one tick taken.
	require.False(t, silentTooLong(5*time.Second, 1, cfg))
	require.False(t, silentTooLong(5*time.Second, cfg.Misses, cfg))
	require.True(t, silentTooLong(5*time.Second, cfg.Misses+1, cfg))
	// Running: the ticks follow the clock; the last tick before the bound
	// decides.
	require.False(t, silentTooLong(600*time.Millisecond, cfg.Misses, cfg))
	require.True(t, silentTooLong(650*time.Millisecond, cfg.Misses+1, cfg))
	require.LessOrEqual(t, 650*time.Millisecond, cfg.Bound())
	// Ticks without the wall time (a burst after a stall) are no silence.
	require.False(t, silentTooLong(300*time.Millisecond, 20, cfg))
}
