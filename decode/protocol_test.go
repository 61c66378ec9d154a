package decode

import (
	"context"
	stderrors "errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testNode(t *testing.T) *Node {
	t.Helper()
	n, err := Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		assert.NoError(t, n.Close(ctx))
	})
	return n
}

// A Hello of another protocol version gets the server's version and a
// refusal that names both; nothing else is exchanged.
func TestServerRefusesAnotherVersion(t *testing.T) {
	n := testNode(t)
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("d")
	require.NoError(t, err)
	defer tr.Close()
	pool, err := hostmem.Alloc(4096)
	require.NoError(t, err)
	defer pool.Free()
	srv, err := New(n, tr, Config{Buffers: []Buffer{{Name: "KV0", Base: pool.Addr, ItemLen: 256, Pages: 16}}})
	require.NoError(t, err)
	defer srv.Close(context.Background())

	// The Hello comes from a future on this node: its session actor must be
	// on the same node, so name one that is (it need not exist to be named).
	res, err := n.request(context.Background(), srv.pid, &wire.Hello{Version: 99, Prefill: "old", SessionAddress: n.Addr(), SessionId: "x",
		Buffers: []*wire.Buffer{{Name: "KV0", ItemLen: 256}}}, time.Second)
	require.NoError(t, err)
	offer := res.(*wire.Offer)
	assert.Equal(t, wire.Code_VERSION, offer.Code)
	assert.Equal(t, ProtocolVersion, offer.Version)
	assert.Equal(t, fmt.Sprintf(`hello from "old": protocol version 99, this decode server speaks %d`, ProtocolVersion), offer.Error)
	assert.Empty(t, offer.Regions, "no pool described to a peer that cannot read it")
	assert.Empty(t, offer.Session)

	// The same Hello again from its session actor, which sent nothing yet,
	// gets the same offer (its first answer may have come after the
	// prefill's call timeout); one from another session actor of the same
	// identity is refused.
	live, err := n.system.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "s1") // a session actor that stays
	require.NoError(t, err)
	defer n.stopActor(context.Background(), live)
	hello := &wire.Hello{Version: ProtocolVersion, Prefill: "p", SessionAddress: live.Address, SessionId: live.Id, PageSize: 16,
		Buffers: []*wire.Buffer{{Name: "KV0", ItemLen: 256}}}
	res, err = n.request(context.Background(), srv.pid, hello, time.Second)
	require.NoError(t, err)
	require.Equal(t, wire.Code_OK, res.(*wire.Offer).Code, res.(*wire.Offer).Error)
	first := res.(*wire.Offer).Session
	res, err = n.request(context.Background(), srv.pid, hello, time.Second)
	require.NoError(t, err)
	require.Equal(t, wire.Code_OK, res.(*wire.Offer).Code, res.(*wire.Offer).Error)
	assert.Equal(t, first, res.(*wire.Offer).Session, "the same session offered again")
	other, err := n.system.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "s2")
	require.NoError(t, err)
	defer n.stopActor(context.Background(), other)
	hello.SessionId = other.Id
	res, err = n.request(context.Background(), srv.pid, hello, time.Second)
	require.NoError(t, err)
	assert.Equal(t, wire.Code_UNAVAILABLE, res.(*wire.Offer).Code, "one live session per prefill identity")
	assert.Contains(t, res.(*wire.Offer).Error, `prefill "p" already has a live session`)

	// A notice with a session the server never gave is refused.
	res, err = n.request(context.Background(), srv.pid, &wire.ChunkNotice{Session: "forged", Room: 1, Status: wire.Status_SUCCEEDED}, time.Second)
	require.NoError(t, err)
	assert.Equal(t, wire.Code_REFUSED, res.(*wire.NoticeAck).Code)
	res, err = n.request(context.Background(), srv.pid, &wire.Bye{Session: "forged"}, time.Second)
	require.NoError(t, err)
	assert.Equal(t, wire.Code_REFUSED, res.(*wire.Summary).Code)
}

// A prefill that reaches a decode server of another version gets an error
// marked ErrVersion that names both versions.
func TestDialRefusesAnotherVersion(t *testing.T) {
	n := testNode(t)
	_, err := n.system.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*wire.Hello); ok {
			ctx.Respond(&wire.Offer{Version: 9, Code: wire.Code_VERSION, Error: "protocol version 2, this decode server speaks 9"})
		}
	}), ServerActor)
	require.NoError(t, err)
	_, err = Dial(context.Background(), n, DialConfig{Decode: n.Addr(), Buffers: system.MLABuffers([]uint64{1}, 256, 16), PageSize: 16})
	require.Error(t, err)
	assert.True(t, stderrors.Is(err, ErrVersion), "%v", err)
	assert.True(t, stderrors.Is(err, ErrBadInput), "%v", err)
	assert.Contains(t, err.Error(), fmt.Sprintf("speaks protocol version 9, this prefill %d", ProtocolVersion))
}
