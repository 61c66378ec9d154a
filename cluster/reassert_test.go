package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdtest"
)

// reassertBound is how long a live member may take to put its record back
// after someone rewrote or deleted it: it checks at every keep-alive
// answer, which etcd's client asks for every TTL/3 (steadyTTL's members),
// from a send loop that wakes every 500 ms; the rest is room for a busy
// machine. Without re-assertion the record never comes back.
const reassertBound = steadyTTL/3 + 500*time.Millisecond + 3*time.Second

// rawClient is an etcd client of the test's own, as etcdctl would be.
func rawClient(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	return raw
}

// TestEtcdRewrittenRecordIsPutBack: a member process whose record someone
// else overwrites (without a lease, or under another live lease) or
// deletes puts its own record back, under its own lease, within its
// keep-alive interval; meanwhile the rewritten record does not count (a
// watcher sees the member leave, then come back). It once stayed
// unlisted for as long as its lease lived, and `kvstream up` waited for
// it in vain.
func TestEtcdRewrittenRecordIsPutBack(t *testing.T) {
	srv := etcdtest.Start(t)
	watcher := newEtcd(t, srv)
	ctx := ctxT(t)
	raw := rawClient(t, srv)
	startMember(t, srv.Endpoint(), "decode-1", "127.0.0.1:9001", steadyTTL)
	member := decode("decode-1", "127.0.0.1:9001")
	key := cluster.DefaultPrefix + "/members/decode/decode-1"
	resp, err := raw.Get(ctx, key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	own := resp.Kvs[0]
	require.NotZero(t, own.Lease, "registered under a lease")
	initial, events, err := watcher.Watch(ctx, cluster.RoleDecode)
	require.NoError(t, err)
	require.Equal(t, []cluster.Member{member}, initial)
	other, err := raw.Grant(ctx, 60)
	require.NoError(t, err)

	for _, tc := range []struct {
		name    string
		rewrite func() error
	}{
		{"without a lease", func() error { _, err := raw.Put(ctx, key, string(own.Value)); return err }},
		{"under another lease", func() error {
			_, err := raw.Put(ctx, key, string(own.Value), clientv3.WithLease(other.ID))
			return err
		}},
		{"deleted", func() error { _, err := raw.Delete(ctx, key); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.rewrite())
			at := time.Now()
			require.Equal(t, cluster.Event{Kind: cluster.Left, Member: member}, next(t, events, reassertBound),
				"the rewritten record is not the member's")
			require.Equal(t, cluster.Event{Kind: cluster.Joined, Member: member}, next(t, events, reassertBound),
				"the member puts its record back")
			back := time.Since(at)
			t.Logf("put back %v after the rewrite", back.Round(time.Millisecond))
			resp, err := raw.Get(ctx, key)
			require.NoError(t, err)
			require.Len(t, resp.Kvs, 1)
			assert.Equal(t, string(own.Value), string(resp.Kvs[0].Value), "its own record")
			assert.Equal(t, own.Lease, resp.Kvs[0].Lease, "under its own lease")
			m, err := watcher.Lookup(ctx, cluster.RoleDecode, "decode-1")
			require.NoError(t, err)
			assert.Equal(t, member, m)
		})
	}
}

// TestEtcdRecordUnderAnotherLeaseIsNotAMember: a record counts as a member
// only when its key is attached to the live lease the record names; one
// attached to another live lease, or naming none, is left out of lookups,
// listings and watches, whoever wrote it.
func TestEtcdRecordUnderAnotherLeaseIsNotAMember(t *testing.T) {
	srv := etcdtest.Start(t)
	p, logs := observed(t, srv)
	ctx := ctxT(t)
	raw := rawClient(t, srv)
	initial, events, err := p.Watch(ctx, cluster.RoleDecode)
	require.NoError(t, err)
	require.Empty(t, initial)
	l1, err := raw.Grant(ctx, 60)
	require.NoError(t, err)
	l2, err := raw.Grant(ctx, 60)
	require.NoError(t, err)
	put := func(id string, named clientv3.LeaseID, under clientv3.LeaseID) {
		t.Helper()
		lease := ""
		if named != 0 {
			lease = fmt.Sprintf(`,"lease":%d`, int64(named))
		}
		_, err := raw.Put(ctx, cluster.DefaultPrefix+"/members/decode/"+id,
			`{"id":"`+id+`","role":"decode","addr":"127.0.0.1:9000"`+lease+`}`, clientv3.WithLease(under))
		require.NoError(t, err)
	}
	put("decode-7", l1.ID, l2.ID) // names a live lease, attached to another
	put("decode-6", 0, l2.ID)     // names none
	put("decode-5", l2.ID, l2.ID) // as a member writes it
	// The watch reports the puts in order: decode-5 is the first member.
	require.Equal(t, cluster.Event{Kind: cluster.Joined, Member: decode("decode-5", "127.0.0.1:9000")}, next(t, events, 5*time.Second))

	ms, err := p.List(ctx, cluster.RoleDecode)
	require.NoError(t, err)
	assert.Equal(t, []cluster.Member{decode("decode-5", "127.0.0.1:9000")}, ms)
	for _, id := range []string{"decode-6", "decode-7"} {
		_, err = p.Lookup(ctx, cluster.RoleDecode, id)
		requireIs(t, err, cluster.ErrNotFound, id)
		assert.ErrorContains(t, err, fmt.Sprintf("attached to lease %x but names lease", int64(l2.ID)))
	}
	why := map[string]string{}
	for _, e := range logs.FilterMessage("cluster: ignoring a member record").All() {
		why[e.ContextMap()["key"].(string)] = e.ContextMap()["why"].(string)
	}
	assert.Contains(t, why[cluster.DefaultPrefix+"/members/decode/decode-7"], fmt.Sprintf("names lease %x", int64(l1.ID)))
	assert.Contains(t, why[cluster.DefaultPrefix+"/members/decode/decode-6"], "names lease 0")
}
