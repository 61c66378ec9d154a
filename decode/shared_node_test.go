package decode_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServersShareANode: Servers with distinct Config.Names share a node,
// each with its own pool and peer id, and a prefill reaches each by
// DialConfig.Server (the unnamed one without it); a name already taken,
// or one that cannot be part of an actor's name, is refused on both
// sides.
func TestServersShareANode(t *testing.T) {
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(t, err)
	defer tr.Close()
	node, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	defer node.Close(context.Background())

	names := []string{"", "pp0-tp1", "pp1-tp0"}
	for _, name := range names {
		pool, err := hostmem.Alloc(buffers * itemLen * pages)
		require.NoError(t, err)
		defer pool.Free()
		srv, err := decode.New(node, tr, decode.Config{Name: name, ID: "decode-" + name, Buffers: decodeBuffers(pool), ByeGrace: time.Minute})
		require.NoError(t, err)
		defer srv.Close(context.Background())
	}
	for _, name := range names {
		c, err := decode.Dial(waitCtx(t), node, decode.DialConfig{Decode: node.Addr(), Server: name, Buffers: prefillLayout(itemLen), PageSize: 4})
		require.NoError(t, err, "server %q", name)
		assert.Equal(t, "decode-"+name, c.Peer().ID, "the session is the named server's")
		_, err = c.Bye(waitCtx(t), nil)
		assert.NoError(t, err)
	}

	pool, err := hostmem.Alloc(buffers * itemLen * pages)
	require.NoError(t, err)
	defer pool.Free()
	_, err = decode.New(node, tr, decode.Config{Name: "pp0-tp1", Buffers: decodeBuffers(pool)})
	assert.ErrorContains(t, err, "distinct Config.Names")
	for _, bad := range []string{"pp0/tp1", "a b", string(make([]byte, 65))} {
		_, err = decode.New(node, tr, decode.Config{Name: bad, Buffers: decodeBuffers(pool)})
		assert.True(t, errors.Is(err, decode.ErrBadInput), "Config.Name %q: %v", bad, err)
		_, err = decode.Dial(waitCtx(t), node, decode.DialConfig{Decode: node.Addr(), Server: bad, Buffers: prefillLayout(itemLen), PageSize: 4})
		assert.True(t, errors.Is(err, decode.ErrBadInput), "DialConfig.Server %q: %v", bad, err)
	}
}

// TestAdmitRefusesBeforeSizing: Config.Admit sees the Hello's metadata
// and its refusal reaches Dial as ErrBadInput with its text, before the
// pool is sized; a Hello it admits is served.
func TestAdmitRefusesBeforeSizing(t *testing.T) {
	pool := sizedPool(t)
	sized := 0
	var seen []map[string]string
	r := newRig(t, decode.Config{
		Admit: func(prefill string, md map[string]string) error {
			seen = append(seen, md)
			if md["model"] != "m1" {
				return errors.New("the prefill's model " + md["model"] + ", this decode's m1")
			}
			return nil
		},
		Size: func([]decode.PrefillBuffer) ([]decode.Buffer, error) {
			sized++
			return decodeBuffers(pool), nil
		},
	})
	_, err := decode.Dial(waitCtx(t), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Metadata: map[string]string{"model": "m2"}})
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "the prefill's model m2, this decode's m1")
	assert.Zero(t, sized, "nothing sized for a refused Hello")

	c, err := decode.Dial(waitCtx(t), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Metadata: map[string]string{"model": "m1"}})
	require.NoError(t, err)
	assert.Equal(t, 1, sized)
	require.NoError(t, r.srv.Expect(3, []int{0}))
	require.NoError(t, c.Notify(waitCtx(t), notice(3, 0, 1, 0, true, system.Succeeded, nil)))
	_, err = c.Bye(waitCtx(t), nil)
	assert.NoError(t, err)
	assert.Equal(t, []map[string]string{{"model": "m2"}, {"model": "m1"}}, seen)
}
