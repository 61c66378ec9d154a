package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdtest"
)

// TestEtcdIdentityTakenWhileLiveEndsRegistration: a process restarted with
// a live predecessor's identity waits in Register; an operator deletes the
// "stale" key to let it in, and it takes the key. The predecessor, still
// alive, must not put its record back over the new holder's (the two
// would overwrite each other at every keep-alive, and watchers and Pick
// would alternate between their addresses): its registration ends with
// ErrConflict at its next keep-alive, and the key stays the new holder's.
func TestEtcdIdentityTakenWhileLiveEndsRegistration(t *testing.T) {
	srv := etcdtest.Start(t)
	p1 := newEtcd(t, srv)
	p2 := newEtcd(t, srv)
	watcher := newEtcd(t, srv)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	key := cluster.DefaultPrefix + "/members/decode/decode-1"
	r1, err := p1.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
	require.NoError(t, err)
	resp, err := raw.Get(ctx, key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	lease1 := clientv3.LeaseID(resp.Kvs[0].Lease)

	type result struct {
		reg cluster.Registration
		err error
	}
	second := make(chan result, 1)
	go func() {
		r, err := p2.Register(ctx, decode("decode-1", "127.0.0.1:9002"))
		second <- result{r, err}
	}()
	// The operator deletes the first's record until the second has taken
	// the key; the first may put it back in between (the key was free).
	// Only the first's record is deleted, never the second's.
	var r2 cluster.Registration
	for r2 == nil {
		_, err := raw.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease1)).
			Then(clientv3.OpDelete(key)).
			Commit()
		require.NoError(t, err)
		select {
		case res := <-second:
			require.NoError(t, res.err, "the second registers once the key is free")
			r2 = res.reg
			t.Cleanup(func() { _ = r2.Close() })
		case <-time.After(50 * time.Millisecond):
		}
	}
	resp, err = raw.Get(ctx, key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	lease2 := resp.Kvs[0].Lease
	require.NotEqual(t, int64(lease1), lease2, "the second holds the key under its own lease")
	taken := resp.Header.Revision

	select {
	case <-r1.Done():
	case <-time.After(reassertBound):
		t.Fatalf("the first registration did not end within %v of the second taking its identity", reassertBound)
	}
	requireIs(t, r1.Err(), cluster.ErrConflict)
	assert.ErrorContains(t, r1.Err(), "127.0.0.1:9002", "names the new holder")
	assert.NoError(t, r1.Close())
	requireIs(t, r1.Err(), cluster.ErrConflict, "Close keeps the reason")

	// Nobody writes the key over several of the first's keep-alive
	// periods (it would have within one).
	wctx, cancel := context.WithTimeout(ctx, 3*steadyTTL/3+time.Second)
	defer cancel()
	for wr := range raw.Watch(wctx, key, clientv3.WithRev(taken+1)) {
		if wctx.Err() != nil {
			break
		}
		require.NoError(t, wr.Err())
		for _, ev := range wr.Events {
			t.Errorf("the key changed after the second took it: %s %q under lease %x", ev.Type, ev.Kv.Value, ev.Kv.Lease)
		}
	}
	select {
	case <-r2.Done():
		t.Fatalf("the second registration ended: %v", r2.Err())
	default:
	}
	resp, err = raw.Get(ctx, key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	assert.Equal(t, lease2, resp.Kvs[0].Lease)
	assert.True(t, strings.Contains(string(resp.Kvs[0].Value), "127.0.0.1:9002"), "the second's record: %s", resp.Kvs[0].Value)
	m, err := watcher.Lookup(ctx, cluster.RoleDecode, "decode-1")
	require.NoError(t, err)
	assert.Equal(t, decode("decode-1", "127.0.0.1:9002"), m)
}
