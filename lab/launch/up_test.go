package launch

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/cluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpWaitsForItsOwnNodes: the launcher waits for the nodes it started,
// by id and by the address each process announced, and names what it
// still waits for; a member it did not start (another cluster's, a stale
// or forged record) neither counts nor stalls it (a forged decode record
// once kept it waiting, silently, for its 2-minute bound).
func TestUpWaitsForItsOwnNodes(t *testing.T) {
	ctx := context.Background()
	local := cluster.NewLocal()
	defer local.Close()
	res := cluster.NewResolver(local)
	defer res.Close()
	for _, role := range cluster.Roles {
		require.NoError(t, res.Follow(role))
	}
	sup := NewSupervisor("/bin/true", nil, nil)
	u := &up{sup: sup, res: res}
	addChild := func(id string, role cluster.Role, rank int, addr string) {
		c := &child{spec: ChildSpec{ID: id, Role: role, Rank: rank}, addr: addr}
		sup.mu.Lock()
		sup.children[id] = c
		sup.mu.Unlock()
	}
	addChild("decode-0", cluster.RoleDecode, 0, "127.0.0.1:9000")
	addChild("decode-1", cluster.RoleDecode, 0, "")
	addChild("g0-r0", cluster.RolePrefill, 0, "127.0.0.1:9100")

	register := func(m cluster.Member) {
		_, err := local.Register(ctx, m)
		require.NoError(t, err)
	}
	register(cluster.Member{ID: "decode-9", Role: cluster.RoleDecode, Addr: "127.0.0.1:6666"}) // not ours
	register(cluster.Member{ID: "decode-0", Role: cluster.RoleDecode, Addr: "127.0.0.1:9000"})
	eventually := func(want string) {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Join(u.missing(), "; ") == want }, 5e9, 1e6, "missing: %v", u.missing())
	}
	eventually("decode decode-1 to start (no ready line yet); prefill g0-r0 to register on etcd")

	c := sup.child("decode-1")
	c.mu.Lock()
	c.addr = "127.0.0.1:9001" // its process announced itself
	c.mu.Unlock()
	register(cluster.Member{ID: "decode-1", Role: cluster.RoleDecode, Addr: "127.0.0.1:7777"})
	register(cluster.Member{ID: "g0-r0", Role: cluster.RolePrefill, Addr: "127.0.0.1:9100", Group: Group, Rank: 0, Size: 2})
	eventually("decode decode-1: etcd lists it at 127.0.0.1:7777, its process serves at 127.0.0.1:9001 (an old lease not expired yet?)")

	// A fresh membership: every node of up's registered at its address,
	// the group still missing a rank.
	local2 := cluster.NewLocal()
	defer local2.Close()
	res2 := cluster.NewResolver(local2)
	defer res2.Close()
	for _, role := range cluster.Roles {
		require.NoError(t, res2.Follow(role))
	}
	u.res = res2
	_, err := local2.Register(ctx, cluster.Member{ID: "decode-0", Role: cluster.RoleDecode, Addr: "127.0.0.1:9000"})
	require.NoError(t, err)
	_, err = local2.Register(ctx, cluster.Member{ID: "decode-1", Role: cluster.RoleDecode, Addr: "127.0.0.1:9001"})
	require.NoError(t, err)
	_, err = local2.Register(ctx, cluster.Member{ID: "g0-r0", Role: cluster.RolePrefill, Addr: "127.0.0.1:9100", Group: Group, Rank: 0, Size: 2})
	require.NoError(t, err)
	eventually(`CP group "g0" of size 2: ranks [1] not registered`)
	_, err = local2.Register(ctx, cluster.Member{ID: "decode-9", Role: cluster.RoleDecode, Addr: "127.0.0.1:6666"})
	require.NoError(t, err)
	_, err = local2.Register(ctx, cluster.Member{ID: "g0-r1", Role: cluster.RolePrefill, Addr: "127.0.0.1:9101", Group: Group, Rank: 1, Size: 2})
	require.NoError(t, err)
	eventually("")
}

// TestFaultsEndWithTheDrain: the context up gives its fault injector ends
// at the drain (the first signal) with its cause, and at a cut (the
// second) too: a rolling restart waited only for the cut, holding the
// drain past --drain-timeout.
func TestFaultsEndWithTheDrain(t *testing.T) {
	for _, first := range []string{"drain", "cut"} {
		accept, drain := context.WithCancelCause(context.Background())
		hard, cut := context.WithCancelCause(context.Background())
		ctx, release := untilEither(accept, hard)
		require.NoError(t, ctx.Err(), "running")
		why := errors.New(first)
		if first == "drain" {
			drain(why)
		} else {
			cut(why)
		}
		<-ctx.Done()
		assert.Equal(t, why, context.Cause(ctx), first)
		release()
		drain(nil)
		cut(nil)
	}
}
