package netsec

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHeartbeatProbe: a probe of a peer that answers changes nothing; a
// probe of a peer that stopped answering declares it lost within the
// probe's window, long before the heartbeats' bound.
func TestHeartbeatProbe(t *testing.T) {
	cfg := HeartbeatConfig{Interval: time.Hour, Misses: 1} // the bound alone would take two hours
	var p *peerNode
	p = startPeer(t, fx.c.prefill.ServerConfig(), fx.c.prefill.ClientConfig(), fx.addr, func(d delivery) {
		if ping, ok := d.msg.(*Ping); ok && d.sender != nil {
			_ = p.send(d.sender, nil, &Pong{Seq: ping.Seq})
		}
	})
	lost := make(chan error, 1)
	m, err := WatchHeartbeats(fx.n.system, p.pid(HeartbeatActor), cfg, func(err error) { lost <- err })
	require.NoError(t, err)
	defer m.Stop()

	// A generous window: an answering peer must not be taken for a dead
	// one by a loaded machine.
	m.Probe(3 * time.Second)
	select {
	case err := <-lost:
		t.Fatalf("a peer that answers was declared lost: %v", err)
	case <-time.After(4 * time.Second):
	}

	p.stopHang()
	probed := time.Now()
	m.Probe(200 * time.Millisecond)
	select {
	case err := <-lost:
		require.ErrorIs(t, err, ErrPeerLost)
		require.ErrorContains(t, err, "the connection to it ended and it answered no heartbeat within")
		t.Logf("declared lost %v after the probe", time.Since(probed).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("a peer that stopped answering was not declared lost by the probe")
	}
}
