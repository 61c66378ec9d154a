package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdtest"
)

// testTTL is the lease TTL of members whose expiry a test waits for: the
// minimum etcdtest's tick settings allow (1.5 election timeouts of 500 ms,
// rounded up).
const testTTL = time.Second

// steadyTTL is every other member's: long enough that a test process
// starved of CPU on a loaded machine does not miss its keep-alives and see
// its own members flap.
const steadyTTL = 5 * time.Second

// newEtcd opens a provider on srv; closed when the test ends.
func newEtcd(t *testing.T, srv *etcdtest.Server, mod ...func(*cluster.Config)) *cluster.Etcd {
	t.Helper()
	cfg := cluster.Config{
		Endpoints: []string{srv.Endpoint()},
		TTL:       steadyTTL,
		OpTimeout: time.Second,
		Logger:    zaptest.NewLogger(t),
	}
	for _, f := range mod {
		f(&cfg)
	}
	p, err := cluster.NewEtcd(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// providers runs f once per provider kind: the in-process one, and etcd
// (skipped without the etcd binary).
func providers(t *testing.T, f func(t *testing.T, p cluster.Provider)) {
	t.Run("local", func(t *testing.T) {
		p := cluster.NewLocal()
		t.Cleanup(func() { _ = p.Close() })
		f(t, p)
	})
	t.Run("etcd", func(t *testing.T) {
		f(t, newEtcd(t, etcdtest.Start(t)))
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// next returns the next event of a watch within d.
func next(t *testing.T, ch <-chan cluster.Event, d time.Duration) cluster.Event {
	t.Helper()
	select {
	case e, ok := <-ch:
		require.True(t, ok, "watch closed")
		return e
	case <-time.After(d):
		t.Fatalf("no watch event within %v", d)
		return cluster.Event{}
	}
}

func decode(id, addr string) cluster.Member {
	return cluster.Member{ID: id, Role: cluster.RoleDecode, Addr: addr}
}

func prefill(id, addr, group string, rank, size int) cluster.Member {
	return cluster.Member{ID: id, Role: cluster.RolePrefill, Addr: addr, Group: group, Rank: rank, Size: size}
}

// requireIs checks a mark with cockroachdb/errors (the standard library's
// errors.Is, which testify uses, does not see marks).
func requireIs(t *testing.T, err, target error, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Truef(t, errors.Is(err, target), "error %q is not marked %q %v", err, target, msgAndArgs)
}
