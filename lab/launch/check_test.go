package launch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckRefusesNegativeFaultBatchAndRoomTimeout: a negative
// --fault-batch (a batch that never comes: the fault was never injected)
// and a negative --room-timeout (the rooms' bound silently off) are
// refused, naming the flag and the value; a fault batch past the run's
// last is refused as before, and 0 is a batch (the first) and a room
// timeout (never).
func TestCheckRefusesNegativeFaultBatchAndRoomTimeout(t *testing.T) {
	cfg := func(f Fault, batch int, room time.Duration) *Config {
		return &Config{Exe: "/bin/true", Ranks: 1, Decodes: 1, Batches: 2, Requests: 1, Fault: f, FaultBatch: batch, RoomTimeout: room}
	}
	for _, tc := range []struct {
		c    *Config
		want string
	}{
		{cfg(KillDecode, -5, time.Minute), "--fault-batch -5: want a batch of the run, counted from 0"},
		{cfg(NoFault, -1, time.Minute), "--fault-batch -1"},
		{cfg(KillDecode, 2, time.Minute), "--fault-batch 2: the run has 2 batches (0 to 1)"},
		{cfg(NoFault, 1, -time.Second), "--room-timeout -1s: want 0 (rooms never time out) or more"},
	} {
		err := tc.c.Check()
		require.Error(t, err, tc.want)
		assert.Contains(t, err.Error(), tc.want)
	}
	for _, c := range []*Config{cfg(KillDecode, 0, 0), cfg(KillPrefill, 1, time.Minute), cfg(NoFault, 7, 0)} {
		require.NoError(t, c.Check())
	}
}
