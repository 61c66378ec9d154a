package cluster_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdtest"
)

// counting counts the lookups that reach the provider.
type counting struct {
	cluster.Provider
	lookups atomic.Int64
}

func (c *counting) Lookup(ctx context.Context, role cluster.Role, id string) (cluster.Member, error) {
	c.lookups.Add(1)
	return c.Provider.Lookup(ctx, role, id)
}

// TestResolverCaches: the first Resolve of an identity asks the provider,
// the next ones do not; Forget makes it ask again; a missing member is not
// cached.
func TestResolverCaches(t *testing.T) {
	providers(t, func(t *testing.T, p cluster.Provider) {
		ctx := ctxT(t)
		_, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
		require.NoError(t, err)
		c := &counting{Provider: p}
		r := cluster.NewResolver(c)
		defer r.Close()
		for range 100 {
			m, err := r.Resolve(ctx, cluster.RoleDecode, "decode-1")
			require.NoError(t, err)
			require.Equal(t, "127.0.0.1:9001", m.Addr)
		}
		require.EqualValues(t, 1, c.lookups.Load(), "resolved once")
		r.Forget(cluster.RoleDecode, "decode-1")
		_, err = r.Resolve(ctx, cluster.RoleDecode, "decode-1")
		require.NoError(t, err)
		require.EqualValues(t, 2, c.lookups.Load())

		for range 2 {
			_, err = r.Resolve(ctx, cluster.RoleDecode, "decode-2")
			requireIs(t, err, cluster.ErrNotFound)
		}
		require.EqualValues(t, 4, c.lookups.Load(), "a miss is not cached")
	})
}

// TestResolverFollows: with Follow, the cache holds the role's members
// without a lookup, evicts one that leaves, and takes a rejoin's new
// address.
func TestResolverFollows(t *testing.T) {
	providers(t, func(t *testing.T, p cluster.Provider) {
		ctx := ctxT(t)
		reg, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
		require.NoError(t, err)
		c := &counting{Provider: p}
		r := cluster.NewResolver(c)
		defer r.Close()
		require.NoError(t, r.Follow(cluster.RoleDecode))
		resolved := func(addr string) func() bool {
			return func() bool {
				m, err := r.Resolve(ctx, cluster.RoleDecode, "decode-1")
				return err == nil && m.Addr == addr
			}
		}
		require.True(t, resolved("127.0.0.1:9001")(), "Follow returns with the members cached")
		require.Zero(t, c.lookups.Load(), "no lookup for a followed member")

		require.NoError(t, reg.Close())
		require.Eventually(t, func() bool {
			_, err := r.Resolve(ctx, cluster.RoleDecode, "decode-1")
			return err != nil
		}, 5*time.Second, 10*time.Millisecond, "a member that left is evicted")

		reg, err = p.Register(ctx, decode("decode-1", "127.0.0.1:9002"))
		require.NoError(t, err)
		require.Eventually(t, resolved("127.0.0.1:9002"), 5*time.Second, 10*time.Millisecond, "a rejoin's new address")
		require.NoError(t, reg.Close())
	})
}

// TestResolverPick: a scheduler picks among the live decode instances from
// memory; one that leaves is no longer picked, one that joins is.
func TestResolverPick(t *testing.T) {
	providers(t, func(t *testing.T, p cluster.Provider) {
		ctx := ctxT(t)
		r := cluster.NewResolver(p)
		defer r.Close()
		_, err := r.Pick(cluster.RoleDecode, 0)
		requireIs(t, err, cluster.ErrInvalid, "not followed")
		require.ErrorContains(t, err, `"decode" is not followed`)

		require.NoError(t, r.Follow(cluster.RoleDecode))
		_, err = r.Pick(cluster.RoleDecode, 0)
		requireIs(t, err, cluster.ErrNotFound, "no decode instance yet")

		d1, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
		require.NoError(t, err)
		d2, err := p.Register(ctx, decode("decode-2", "127.0.0.1:9002"))
		require.NoError(t, err)
		_, err = p.Register(ctx, prefill("prefill-g0-r0", "127.0.0.1:9100", "g0", 0, 1))
		require.NoError(t, err)
		picked := func(ids ...string) func() bool {
			return func() bool {
				got := map[string]bool{}
				for k := range uint64(4) {
					m, err := r.Pick(cluster.RoleDecode, k)
					if err != nil {
						return false
					}
					got[m.ID] = true
				}
				want := map[string]bool{}
				for _, id := range ids {
					want[id] = true
				}
				return len(got) == len(want) && func() bool {
					for id := range want {
						if !got[id] {
							return false
						}
					}
					return true
				}()
			}
		}
		require.Eventually(t, picked("decode-1", "decode-2"), 5*time.Second, 10*time.Millisecond)
		m0, _ := r.Pick(cluster.RoleDecode, 0)
		m1, _ := r.Pick(cluster.RoleDecode, 1)
		require.Equal(t, []string{"decode-1", "decode-2"}, []string{m0.ID, m1.ID}, "round robin in id order")

		require.NoError(t, d1.Close())
		require.Eventually(t, picked("decode-2"), 5*time.Second, 10*time.Millisecond, "a member that left is not picked")
		require.NoError(t, d2.Close())
		require.Eventually(t, func() bool {
			_, err := r.Pick(cluster.RoleDecode, 0)
			return errors.Is(err, cluster.ErrNotFound)
		}, 5*time.Second, 10*time.Millisecond)
	})
}

// BenchmarkResolve compares the per-forward path (a cached Resolve) with
// what it avoids: a lookup that goes to etcd, one round trip on loopback.
func BenchmarkResolve(b *testing.B) {
	ctx := context.Background()
	b.Run("cached", func(b *testing.B) {
		p := cluster.NewLocal()
		defer p.Close()
		_, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
		require.NoError(b, err)
		r := cluster.NewResolver(p)
		defer r.Close()
		_, err = r.Resolve(ctx, cluster.RoleDecode, "decode-1")
		require.NoError(b, err)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := r.Resolve(ctx, cluster.RoleDecode, "decode-1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("pick", func(b *testing.B) {
		p := cluster.NewLocal()
		defer p.Close()
		for _, id := range []string{"decode-1", "decode-2"} {
			_, err := p.Register(ctx, decode(id, "127.0.0.1:9001"))
			require.NoError(b, err)
		}
		r := cluster.NewResolver(p)
		defer r.Close()
		require.NoError(b, r.Follow(cluster.RoleDecode))
		b.ReportAllocs()
		b.ResetTimer()
		var k uint64
		for b.Loop() {
			k++
			if _, err := r.Pick(cluster.RoleDecode, k); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("etcd-lookup", func(b *testing.B) {
		srv := etcdtest.Start(b)
		p, err := cluster.NewEtcd(cluster.Config{Endpoints: []string{srv.Endpoint()}})
		require.NoError(b, err)
		defer p.Close()
		_, err = p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
		require.NoError(b, err)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := p.Lookup(ctx, cluster.RoleDecode, "decode-1"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestResolveCachedAllocatesNothing pins the benchmark's claim in the
// test suite.
func TestResolveCachedAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	p := cluster.NewLocal()
	defer p.Close()
	_, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
	require.NoError(t, err)
	r := cluster.NewResolver(p)
	defer r.Close()
	_, err = r.Resolve(ctx, cluster.RoleDecode, "decode-1")
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(1000, func() {
		_, _ = r.Resolve(ctx, cluster.RoleDecode, "decode-1")
	})
	require.Zero(t, allocs)
}
