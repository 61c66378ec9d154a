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
