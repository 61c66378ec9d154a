package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWatchResyncDiff: after a watch could not resume (its revision was
// compacted away), the new listing is reported as the difference from what
// the caller was told: members gone leave, changed and new ones join,
// unchanged ones stay silent.
func TestWatchResyncDiff(t *testing.T) {
	m := func(id, addr string) Member { return Member{ID: id, Role: RoleDecode, Addr: addr} }
	out := make(chan Event, 10)
	w := &etcdWatch{role: RoleDecode, out: out, ctx: context.Background(), known: map[string]Member{
		"a": m("a", "127.0.0.1:1"),
		"b": m("b", "127.0.0.1:2"),
		"c": m("c", "127.0.0.1:3"),
	}}
	require.True(t, w.sync([]Member{m("b", "127.0.0.1:2"), m("c", "127.0.0.1:33"), m("d", "127.0.0.1:4")}))
	close(out)
	var got []Event
	for e := range out {
		got = append(got, e)
	}
	require.Equal(t, []Event{
		{Kind: Left, Member: m("a", "127.0.0.1:1")},
		{Kind: Joined, Member: m("c", "127.0.0.1:33")},
		{Kind: Joined, Member: m("d", "127.0.0.1:4")},
	}, got)
	require.Equal(t, map[string]Member{"b": m("b", "127.0.0.1:2"), "c": m("c", "127.0.0.1:33"), "d": m("d", "127.0.0.1:4")}, w.known)
}
