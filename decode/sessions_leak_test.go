package decode_test

import (
	"runtime"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/internal/nettest"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/stretchr/testify/require"
)

// TestPeerNodesCostLittle: every node a decode node sends to (each prefill
// process it serves, and each one again after it exited, for the Unwatch
// that ends its session) costs kilobytes, not megabytes. protoactor sized
// the outgoing queue of every connection it opened for a million messages
// (16 MB): a decode serving one short-lived prefill after another grew by
// about 4 MB a session (120 sessions: 1.2 GB of RSS). Here the node sends
// to addresses where no node listens (a prefill that exited): each opens a
// connection, fails and is dropped. The bound is on the bytes allocated,
// which no scheduling changes. (New nodes are not started for it: a node
// starting in a process where another one's gRPC server logs is a data race
// inside protoactor's remote.Start, which sets gRPC's global logger.)
func TestPeerNodesCostLittle(t *testing.T) {
	r := newRig(t, decode.Config{})
	gone := make([]string, 11)
	for i := range gone {
		gone[i] = nettest.Refusing(t)
	}
	decode.SendToForTest(r.node, gone[0], "kvstream-prefill", &wire.Summary{})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, addr := range gone[1:] {
		decode.SendToForTest(r.node, addr, "kvstream-prefill", &wire.Summary{})
	}
	runtime.ReadMemStats(&after)
	perNode := (after.TotalAlloc - before.TotalAlloc) / uint64(len(gone)-1)
	require.Less(t, perNode, uint64(1<<20), "bytes allocated per peer node")
	t.Logf("%d KiB allocated per peer node", perNode>>10)
}
