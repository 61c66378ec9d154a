package decode_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/system"
)

// TestCallEndsWhenTheDecodeIsLost: a notice the decode process has not
// answered when it is declared lost (SIGSTOPped here, found by the
// heartbeats) returns ErrDecodeLost as soon as the loss is declared, not
// at the end of its call timeout (a minute here): a prefill whose decode
// was killed mid-call fails its chunks within the loss's bound.
func TestCallEndsWhenTheDecodeIsLost(t *testing.T) {
	dec, addr, _ := startDecodeRole(t, "decode")

	hb := decode.HeartbeatWithin(1400 * time.Millisecond)
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0", Heartbeat: hb})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	defer func() { require.NoError(t, node.Close(ctx)) }()
	c, err := decode.Dial(ctx, node, decode.DialConfig{Decode: addr, Buffers: prefillLayout(itemLen), PageSize: 4,
		CallTimeout: time.Minute})
	require.NoError(t, err)
	lost := make(chan struct{})
	c.OnLost(func(error) { close(lost) })

	stopDecode(t, dec)
	notified := make(chan error, 1)
	go func() { notified <- c.Notify(context.Background(), notice(1, 0, 1, 0, true, system.Succeeded, nil)) }()
	select {
	case <-lost:
	case <-time.After(15 * time.Second):
		t.Fatal("the stopped decode process was not declared lost")
	}
	select {
	case err := <-notified:
		assert.True(t, errors.Is(err, decode.ErrDecodeLost), "%v", err)
	case <-time.After(30 * time.Second): // half the call timeout: only the loss can have ended the call
		t.Fatal("the notice still waits for its answer after the decode process was declared lost")
	}
}
