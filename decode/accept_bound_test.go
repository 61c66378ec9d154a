package decode_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/stretchr/testify/require"
)

// dialNamed opens a session named name against r's server.
func (r *rig) dialNamed(t *testing.T, name string) *decode.Client {
	t.Helper()
	c, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: name})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// unaccepted names the sessions the server keeps for Accept, oldest first,
// and returns the one named name among them (nil if none).
func unaccepted(srv *decode.Server, name string) ([]string, *decode.Session) {
	var names []string
	var found *decode.Session
	for _, ss := range decode.UnacceptedForTest(srv) {
		names = append(names, ss.Prefill())
		if ss.Prefill() == name {
			found = ss
		}
	}
	return names, found
}

// TestUnacceptedSessionsAreBounded: a serving stack that never calls
// Accept does not make the server keep every session for its life. Past
// the bound, the oldest sessions that ended are dropped; the live ones all
// stay, and Accept still returns them in the order they said Hello.
func TestUnacceptedSessionsAreBounded(t *testing.T) {
	const bound, ended = 4, 10
	r := newRig(t, decode.Config{})
	decode.SetMaxUnacceptedForTest(r.srv, bound)
	r.dialNamed(t, "live-0")
	for i := range ended {
		if i == ended/2 {
			r.dialNamed(t, "live-1")
		}
		name := fmt.Sprintf("gone-%d", i)
		c := r.dialNamed(t, name)
		names, ss := unaccepted(r.srv, name)
		require.NotNil(t, ss, "%s kept while open: %v", name, names)
		require.LessOrEqual(t, len(names), bound, "%v", names)
		_, err := c.Bye(waitCtx(t), nil)
		require.NoError(t, err)
		_, err = ss.Wait(waitCtx(t))
		require.NoError(t, err, "%s ended", name)
	}
	names, _ := unaccepted(r.srv, "")
	require.Equal(t, []string{"live-0", "live-1", "gone-8", "gone-9"}, names, "the oldest ended sessions dropped, the live ones kept")
	for _, want := range names {
		ss, err := r.srv.Accept(waitCtx(t))
		require.NoError(t, err)
		require.Equal(t, want, ss.Prefill())
	}
	names, _ = unaccepted(r.srv, "")
	require.Empty(t, names)

	// Live sessions are never dropped, even past the bound.
	decode.SetMaxUnacceptedForTest(r.srv, 1)
	r.dialNamed(t, "live-2")
	r.dialNamed(t, "live-3")
	names, _ = unaccepted(r.srv, "")
	require.Equal(t, []string{"live-2", "live-3"}, names)
}
