package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdtest"
)

// TestEtcdMemberProcessDies: a member process killed with SIGKILL never
// revokes its lease; it leaves when the lease expires, within its TTL
// (plus etcd's expiry sweep and the watch's delivery).
func TestEtcdMemberProcessDies(t *testing.T) {
	srv := etcdtest.Start(t)
	p := newEtcd(t, srv)
	ctx := ctxT(t)
	_, events, err := p.Watch(ctx, cluster.RoleDecode)
	require.NoError(t, err)

	cmd := startMember(t, srv.Endpoint(), "decode-1", "127.0.0.1:9001", testTTL)
	require.Equal(t, cluster.Event{Kind: cluster.Joined, Member: decode("decode-1", "127.0.0.1:9001")}, next(t, events, 5*time.Second))

	require.NoError(t, cmd.Process.Kill())
	killed := time.Now()
	e := next(t, events, testTTL+3*time.Second)
	gone := time.Since(killed)
	require.Equal(t, cluster.Event{Kind: cluster.Left, Member: decode("decode-1", "127.0.0.1:9001")}, e)
	t.Logf("member left %v after SIGKILL (TTL %v)", gone.Round(time.Millisecond), testTTL)

	_, err = p.Lookup(ctx, cluster.RoleDecode, "decode-1")
	requireIs(t, err, cluster.ErrNotFound)
}

// TestEtcdRestartedMemberTakesOver: a process restarted right after a
// crash registers the same identity with a new address as soon as the
// dead process's lease expires, with no error.
func TestEtcdRestartedMemberTakesOver(t *testing.T) {
	srv := etcdtest.Start(t)
	p := newEtcd(t, srv)
	ctx := ctxT(t)
	cmd := startMember(t, srv.Endpoint(), "decode-1", "127.0.0.1:9001", testTTL)
	require.NoError(t, cmd.Process.Kill())
	start := time.Now()
	reg, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9002"))
	require.NoError(t, err)
	require.Less(t, time.Since(start), testTTL+3*time.Second)
	m, err := p.Lookup(ctx, cluster.RoleDecode, "decode-1")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9002", m.Addr)
	require.NoError(t, reg.Close())
}

// TestEtcdCloseRevokesAtOnce: a clean Close removes the member without
// waiting for its (long) TTL.
func TestEtcdCloseRevokesAtOnce(t *testing.T) {
	srv := etcdtest.Start(t)
	p := newEtcd(t, srv, func(c *cluster.Config) { c.TTL = 30 * time.Second })
	watcher := newEtcd(t, srv)
	ctx := ctxT(t)
	_, events, err := watcher.Watch(ctx, cluster.RolePrefill)
	require.NoError(t, err)
	reg, err := p.Register(ctx, prefill("prefill-g0-r1", "127.0.0.1:9101", "g0", 1, 8))
	require.NoError(t, err)
	require.Equal(t, cluster.Joined, next(t, events, 5*time.Second).Kind)
	start := time.Now()
	require.NoError(t, reg.Close())
	require.Equal(t, cluster.Event{Kind: cluster.Left, Member: prefill("prefill-g0-r1", "127.0.0.1:9101", "g0", 1, 8)}, next(t, events, 5*time.Second))
	require.Less(t, time.Since(start), 5*time.Second, "revoked, not expired (TTL 30s)")
}

// TestEtcdDownAndBack: while etcd is killed, lookups fail within their
// bound with an error marked ErrUnavailable that says so; once etcd is
// restarted on the same data and ports they recover, the registration is
// still there (etcd renews leases when it restarts) and the watch carries
// on.
func TestEtcdDownAndBack(t *testing.T) {
	srv := etcdtest.Start(t)
	member := newEtcd(t, srv)
	p := newEtcd(t, srv, func(c *cluster.Config) { c.OpTimeout = 500 * time.Millisecond })
	ctx := ctxT(t)
	reg, err := member.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
	require.NoError(t, err)
	initial, events, err := p.Watch(ctx, cluster.RoleDecode)
	require.NoError(t, err)
	require.Len(t, initial, 1)

	srv.Stop()
	for _, call := range []func() error{
		func() error { _, err := p.Lookup(ctx, cluster.RoleDecode, "decode-1"); return err },
		func() error { _, err := p.List(ctx, cluster.RoleDecode); return err },
	} {
		start := time.Now()
		err := call()
		took := time.Since(start)
		requireIs(t, err, cluster.ErrUnavailable)
		require.ErrorContains(t, err, "etcd unreachable at "+srv.Endpoint())
		require.Less(t, took, 3*time.Second, "bounded by OpTimeout (500ms)")
	}
	// The caller's deadline bounds a call too, when it is the shorter.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	start := time.Now()
	_, err = p.Lookup(short, cluster.RoleDecode, "decode-1")
	cancel()
	requireIs(t, err, cluster.ErrUnavailable)
	require.Less(t, time.Since(start), 2*time.Second)

	srv.Restart()
	require.Eventually(t, func() bool {
		m, err := p.Lookup(ctx, cluster.RoleDecode, "decode-1")
		return err == nil && m.Addr == "127.0.0.1:9001"
	}, 10*time.Second, 50*time.Millisecond, "lookup after etcd came back")
	select {
	case <-reg.Done():
		t.Fatalf("registration ended: %v", reg.Err())
	default:
	}
	reg2, err := member.Register(ctx, decode("decode-2", "127.0.0.1:9002"))
	require.NoError(t, err)
	// The watch resumed: decode-2 joins (decode-1 may be re-reported
	// if its lease was lost and renewed while etcd was away).
	for {
		e := next(t, events, 10*time.Second)
		if e.Member.ID == "decode-2" {
			require.Equal(t, cluster.Joined, e.Kind)
			break
		}
		require.Equal(t, "decode-1", e.Member.ID)
	}
	require.NoError(t, reg2.Close())
	require.NoError(t, reg.Close())
}

// TestEtcdPaused: a hung etcd (SIGSTOP: connections open, no answers)
// fails lookups within the caller's deadline, marked ErrUnavailable; they
// recover when it continues.
func TestEtcdPaused(t *testing.T) {
	srv := etcdtest.Start(t)
	p := newEtcd(t, srv, func(c *cluster.Config) { c.OpTimeout = 10 * time.Second })
	ctx := ctxT(t)
	_, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
	require.NoError(t, err)
	srv.Pause()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = p.Lookup(short, cluster.RoleDecode, "decode-1")
	cancel()
	took := time.Since(start)
	srv.Resume()
	requireIs(t, err, cluster.ErrUnavailable)
	require.True(t, strings.Contains(err.Error(), "etcd unreachable"), "%v", err)
	require.Less(t, took, 2*time.Second, "bounded by the caller's 300ms, not OpTimeout's 10s")
	require.Eventually(t, func() bool {
		_, err := p.Lookup(ctx, cluster.RoleDecode, "decode-1")
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)
}

// TestEtcdLeaseLostRejoins: when a member's lease is revoked behind its
// back (what etcd does when the member could not reach it for longer than
// the TTL), the member registers again by itself: watchers see it leave
// and come back, and the registration stays open.
func TestEtcdLeaseLostRejoins(t *testing.T) {
	srv := etcdtest.Start(t)
	p := newEtcd(t, srv)
	ctx := ctxT(t)
	_, events, err := p.Watch(ctx, cluster.RoleDecode)
	require.NoError(t, err)
	reg, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
	require.NoError(t, err)
	require.Equal(t, cluster.Joined, next(t, events, 5*time.Second).Kind)

	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer raw.Close()
	resp, err := raw.Get(ctx, cluster.DefaultPrefix+"/members/decode/decode-1")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "key layout <prefix>/members/<role>/<id>")
	_, err = raw.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)

	require.Equal(t, cluster.Left, next(t, events, 5*time.Second).Kind)
	require.Equal(t, cluster.Event{Kind: cluster.Joined, Member: decode("decode-1", "127.0.0.1:9001")}, next(t, events, 5*time.Second))
	select {
	case <-reg.Done():
		t.Fatalf("registration ended: %v", reg.Err())
	default:
	}
	require.NoError(t, reg.Close())
	require.Equal(t, cluster.Left, next(t, events, 5*time.Second).Kind)
}

// TestEtcdUnreachableAtOpen: a provider for an etcd that is not there
// fails at once, marked ErrUnavailable.
func TestEtcdUnreachableAtOpen(t *testing.T) {
	srv := etcdtest.Start(t)
	srv.Stop()
	start := time.Now()
	_, err := cluster.NewEtcd(cluster.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 500 * time.Millisecond})
	requireIs(t, err, cluster.ErrUnavailable)
	require.ErrorContains(t, err, srv.Endpoint())
	require.Less(t, time.Since(start), 3*time.Second)
}

// TestEtcdLiveDuplicateFails: a second process claiming a live member's
// identity does not wait forever even with a long context: once the
// holder outlived its TTL it is known alive, and the claim fails with
// ErrConflict naming the holder's address.
func TestEtcdLiveDuplicateFails(t *testing.T) {
	srv := etcdtest.Start(t)
	holder := newEtcd(t, srv, func(c *cluster.Config) { c.TTL = 2 * time.Second })
	claimer := newEtcd(t, srv)
	ctx := ctxT(t)
	_, err := holder.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
	require.NoError(t, err)
	start := time.Now()
	_, err = claimer.Register(ctx, decode("decode-1", "127.0.0.1:9002"))
	requireIs(t, err, cluster.ErrConflict)
	// Both members: the claimer and the holder.
	require.ErrorContains(t, err, `register decode "decode-1" at 127.0.0.1:9002: the identity is held by decode "decode-1" at 127.0.0.1:9001, a live member`)
	require.Less(t, time.Since(start), 2*time.Second+5*time.Second)
	m, err := claimer.Lookup(ctx, cluster.RoleDecode, "decode-1")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9001", m.Addr)
}
