package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/cluster"
)

// TestMembership: register, lookup by identity, list by role, watch join
// and leave, on both providers.
func TestMembership(t *testing.T) {
	providers(t, func(t *testing.T, p cluster.Provider) {
		ctx := ctxT(t)
		d0, err := p.Register(ctx, decode("decode-0", "127.0.0.1:9000"))
		require.NoError(t, err)

		initial, events, err := p.Watch(ctx, cluster.RoleDecode)
		require.NoError(t, err)
		require.Equal(t, []cluster.Member{decode("decode-0", "127.0.0.1:9000")}, initial, "a watch starts with the members present")

		d1, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
		require.NoError(t, err)
		r0, err := p.Register(ctx, prefill("prefill-g0-r0", "127.0.0.1:9100", "g0", 0, 2))
		require.NoError(t, err)
		require.Equal(t, cluster.Event{Kind: cluster.Joined, Member: decode("decode-1", "127.0.0.1:9001")}, next(t, events, 5*time.Second))

		m, err := p.Lookup(ctx, cluster.RoleDecode, "decode-1")
		require.NoError(t, err)
		require.Equal(t, decode("decode-1", "127.0.0.1:9001"), m)
		m, err = p.Lookup(ctx, cluster.RolePrefill, "prefill-g0-r0")
		require.NoError(t, err)
		require.Equal(t, prefill("prefill-g0-r0", "127.0.0.1:9100", "g0", 0, 2), m)

		_, err = p.Lookup(ctx, cluster.RoleDecode, "decode-9")
		requireIs(t, err, cluster.ErrNotFound)
		require.ErrorContains(t, err, `"decode-9"`)
		_, err = p.Lookup(ctx, cluster.RolePrefill, "decode-1")
		requireIs(t, err, cluster.ErrNotFound, "identity is per role")

		ds, err := p.List(ctx, cluster.RoleDecode)
		require.NoError(t, err)
		require.Equal(t, []cluster.Member{decode("decode-0", "127.0.0.1:9000"), decode("decode-1", "127.0.0.1:9001")}, ds)
		ps, err := p.List(ctx, cluster.RolePrefill)
		require.NoError(t, err)
		require.Len(t, ps, 1)

		require.NoError(t, d0.Close())
		require.Equal(t, cluster.Event{Kind: cluster.Left, Member: decode("decode-0", "127.0.0.1:9000")}, next(t, events, 5*time.Second))
		select {
		case <-d0.Done():
			require.NoError(t, d0.Err())
		default:
			t.Fatal("Done not closed after Close")
		}
		_, err = p.Lookup(ctx, cluster.RoleDecode, "decode-0")
		requireIs(t, err, cluster.ErrNotFound)

		// The same identity may register again once it left.
		d0, err = p.Register(ctx, decode("decode-0", "127.0.0.1:9010"))
		require.NoError(t, err)
		require.Equal(t, cluster.Event{Kind: cluster.Joined, Member: decode("decode-0", "127.0.0.1:9010")}, next(t, events, 5*time.Second))

		require.NoError(t, r0.Close())
		require.NoError(t, d1.Close())
		require.Equal(t, cluster.Event{Kind: cluster.Left, Member: decode("decode-1", "127.0.0.1:9001")}, next(t, events, 5*time.Second),
			"a decode watch sees no prefill event")
		require.NoError(t, d0.Close())
		require.NoError(t, d0.Close(), "Close twice")
	})
}

// TestConflict: a live member's identity cannot be taken; the attempt is
// bounded by the caller's context and names the holder.
func TestConflict(t *testing.T) {
	providers(t, func(t *testing.T, p cluster.Provider) {
		ctx := ctxT(t)
		_, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
		require.NoError(t, err)
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = p.Register(short, decode("decode-1", "127.0.0.1:9002"))
		requireIs(t, err, cluster.ErrConflict)
		require.ErrorContains(t, err, "127.0.0.1:9001")
		require.Less(t, time.Since(start), 3*time.Second)
	})
}

// TestWatchEndsWithContext: cancelling a watch's context closes its
// channel.
func TestWatchEndsWithContext(t *testing.T) {
	providers(t, func(t *testing.T, p cluster.Provider) {
		ctx, cancel := context.WithCancel(ctxT(t))
		_, events, err := p.Watch(ctx, cluster.RolePrefill)
		require.NoError(t, err)
		cancel()
		select {
		case _, ok := <-events:
			require.False(t, ok, "no member, so no event before the close")
		case <-time.After(5 * time.Second):
			t.Fatal("watch not closed within 5s of its context")
		}
	})
}

// TestProviderClose: Close ends registrations and watches; later calls
// fail with ErrClosed.
func TestProviderClose(t *testing.T) {
	providers(t, func(t *testing.T, p cluster.Provider) {
		ctx := ctxT(t)
		reg, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
		require.NoError(t, err)
		_, events, err := p.Watch(ctx, cluster.RolePrefill)
		require.NoError(t, err)
		require.NoError(t, p.Close())
		select {
		case <-reg.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("registration not done after the provider closed")
		}
		for range events { // must close
		}
		_, err = p.Lookup(ctx, cluster.RoleDecode, "decode-1")
		requireIs(t, err, cluster.ErrClosed)
		_, err = p.Register(ctx, decode("decode-2", "127.0.0.1:9002"))
		requireIs(t, err, cluster.ErrClosed)
		_, err = p.List(ctx, cluster.RoleDecode)
		requireIs(t, err, cluster.ErrClosed)
		_, _, err = p.Watch(ctx, cluster.RoleDecode)
		requireIs(t, err, cluster.ErrClosed)
		require.NoError(t, p.Close(), "Close twice")
	})
}

// TestBadInput: every bad value is an ErrInvalid error that names it.
func TestBadInput(t *testing.T) {
	bad := []struct {
		m    cluster.Member
		want string
	}{
		{decode("", "127.0.0.1:9000"), "empty member id"},
		{decode("decode/1", "127.0.0.1:9000"), `"decode/1"`},
		{decode("decode 1", "127.0.0.1:9000"), `"decode 1"`},
		{cluster.Member{ID: "x", Role: "scheduler", Addr: "127.0.0.1:9000"}, `unknown role "scheduler"`},
		{cluster.Member{ID: "x", Addr: "127.0.0.1:9000"}, `unknown role ""`},
		{decode("decode-1", "not-an-address"), `"not-an-address"`},
		{decode("decode-1", ":9000"), `":9000"`},
		{decode("decode-1", "0.0.0.0:9000"), `wildcard host "0.0.0.0"`},
		{decode("decode-1", "host:0"), `"host:0"`},
		{decode("decode-1", "host:http"), `"host:http"`},
		{decode("decode-1", "host:70000"), `"host:70000"`},
		{prefill("p", "127.0.0.1:9000", "g0", 2, 2), "CP rank 2 of size 2"},
		{prefill("p", "127.0.0.1:9000", "g0", -1, 2), "CP rank -1 of size 2"},
		{prefill("p", "127.0.0.1:9000", "", 0, 2), "empty CP group"},
		{prefill("p", "127.0.0.1:9000", "g0", 0, 1025), "CP rank 0 of size 1025"},
		{cluster.Member{ID: "d", Role: cluster.RoleDecode, Addr: "127.0.0.1:9000", Rank: 1, Size: 2}, "a decode instance has no CP group"},
	}
	providers(t, func(t *testing.T, p cluster.Provider) {
		ctx := ctxT(t)
		for _, c := range bad {
			_, err := p.Register(ctx, c.m)
			requireIs(t, err, cluster.ErrInvalid, "%+v", c.m)
			require.ErrorContains(t, err, c.want, "%+v", c.m)
		}
		_, err := p.Lookup(ctx, "gpu", "decode-1")
		requireIs(t, err, cluster.ErrInvalid)
		require.ErrorContains(t, err, `"gpu"`)
		_, err = p.Lookup(ctx, cluster.RoleDecode, "")
		requireIs(t, err, cluster.ErrInvalid)
		_, err = p.List(ctx, "gpu")
		requireIs(t, err, cluster.ErrInvalid)
		_, _, err = p.Watch(ctx, "gpu")
		requireIs(t, err, cluster.ErrInvalid)
		require.ErrorContains(t, err, `"gpu"`)
	})
}

// TestBadConfig: endpoints and prefixes that cannot work are refused
// before any connection, naming the value.
func TestBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  cluster.Config
		want string
	}{
		{cluster.Config{Endpoints: []string{"ftp://127.0.0.1:2379"}}, `scheme "ftp"`},
		{cluster.Config{Endpoints: []string{"http://127.0.0.1"}}, `"http://127.0.0.1"`},
		{cluster.Config{Endpoints: []string{"etcd-host"}}, `"etcd-host"`},
		{cluster.Config{Endpoints: []string{"127.0.0.1:2379"}, Prefix: "kvstream/"}, `key prefix "kvstream/"`},
	} {
		_, err := cluster.NewEtcd(c.cfg)
		requireIs(t, err, cluster.ErrInvalid, "%+v", c.cfg)
		require.ErrorContains(t, err, c.want)
	}
	_, err := cluster.NewEtcd(cluster.Config{})
	requireIs(t, err, cluster.ErrInvalid)
}

// TestOpenSelects: no endpoints is the in-process provider.
func TestOpenSelects(t *testing.T) {
	p, err := cluster.Open(cluster.Config{})
	require.NoError(t, err)
	require.IsType(t, &cluster.Local{}, p)
	require.NoError(t, p.Close())
	_, err = cluster.Open(cluster.Config{Endpoints: []string{"nohost"}})
	require.True(t, errors.Is(err, cluster.ErrInvalid))
}
