package decode_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvstream/kvstream/decode"
)

// TestLifecycleLogsAtInfo: at INFO a server says when a session opens and
// ends and when a drain starts and ends, each line naming the server
// (node address and actor), and nothing else is logged at INFO for a
// session that streamed a room.
func TestLifecycleLogsAtInfo(t *testing.T) {
	obs, logs := observer.New(zap.InfoLevel)
	r := newRig(t, decode.Config{Log: zap.New(obs)})
	require.NoError(t, r.srv.Expect(7, []int{4, 5}))
	c := r.dial(t)
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, true, 0, nil)))
	_, err := r.srv.Wait(waitCtx(t), 7)
	require.NoError(t, err)
	_, err = r.srv.Accept(waitCtx(t))
	require.NoError(t, err)

	drained := make(chan error, 1)
	go func() { drained <- r.srv.Drain(context.Background()) }()
	_, err = c.Bye(waitCtx(t), nil)
	require.NoError(t, err)
	require.NoError(t, <-drained)

	var msgs []string
	server := r.node.Addr() + "/" + decode.ServerActor
	for _, e := range logs.All() {
		require.Equal(t, zapcore.InfoLevel, e.Level, "%s", e.Message)
		assert.Equal(t, server, e.ContextMap()["server"], "%s", e.Message)
		msgs = append(msgs, e.Message)
	}
	// The drain's first line and the session's end race (Bye is sent
	// while Drain is being asked); the session opened first and the drain
	// ended last.
	require.Len(t, msgs, 4)
	assert.ElementsMatch(t, []string{"decode session opened", "decode server draining: no new session", "decode session ended",
		"decode server drained: no session left"}, msgs)
	assert.Equal(t, "decode session opened", msgs[0])
	assert.Equal(t, "decode server drained: no session left", msgs[3])
	ended := logs.FilterMessage("decode session ended").All()
	require.Len(t, ended, 1)
	assert.Equal(t, "p0", ended[0].ContextMap()["prefill"])
}

// TestListenIPv6: a node listens on an IPv6 address given as [host]:port,
// and says so in the same form.
func TestListenIPv6(t *testing.T) {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	require.NoError(t, l.Close())
	node, err := decode.Listen("[::1]:0", nil)
	require.NoError(t, err)
	defer func() { assert.NoError(t, node.Close(context.Background())) }()
	host, port, err := net.SplitHostPort(node.Addr())
	require.NoError(t, err, node.Addr())
	assert.Equal(t, "::1", host)
	assert.NotEqual(t, "0", port)
}

// TestEveryLineNamesTheServer: at DEBUG too, every line the server logs
// names it as the INFO lines do (node address and actor), the line
// telling a session of the drain included.
func TestEveryLineNamesTheServer(t *testing.T) {
	obs, logs := observer.New(zap.DebugLevel)
	r := newRig(t, decode.Config{Log: zap.New(obs)})
	c := r.dial(t)
	told := make(chan struct{})
	c.OnDrain(func(string) { close(told) })
	drained := make(chan error, 1)
	go func() { drained <- r.srv.Drain(context.Background()) }()
	select {
	case <-told:
	case <-waitCtx(t).Done():
		t.Fatal("the session was not told of the drain")
	}
	_, err := c.Bye(waitCtx(t), nil)
	require.NoError(t, err)
	require.NoError(t, <-drained)

	server := r.node.Addr() + "/" + decode.ServerActor
	require.NotZero(t, logs.FilterMessage("told a prefill session the server drains").Len())
	// Config.Log is the server's alone (the rig's node, and the client,
	// log elsewhere): every line observed is the server's, and a line
	// without the field fails as one that names another server does.
	for _, e := range logs.All() {
		v, ok := e.ContextMap()["server"]
		if assert.True(t, ok, "%q does not name the server", e.Message) {
			assert.Equal(t, server, v, "%s", e.Message)
		}
	}
}
