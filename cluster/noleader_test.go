package cluster_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdproc"
)

// TestEtcdWatchFailsWithoutLeader: a watch attached to an etcd member that
// lost its leader must fail ("no leader") and list again, retrying until
// etcd answers, rather than stay silent for as long as the member is cut
// off (while the rest of the cluster, on the far side, goes on changing).
// One etcd cannot be partitioned from its peers, but it can lose its
// leader: a second voting member is added that never starts, so the one
// running member has no quorum and steps down (etcd's check-quorum).
func TestEtcdWatchFailsWithoutLeader(t *testing.T) {
	const electionMs = 500
	proc, err := etcdproc.Start(etcdproc.Options{
		DataDir:     t.TempDir(),
		HeartbeatMs: 50,
		ElectionMs:  electionMs,
		// Adding a member that will not start is a quorum loss, which
		// etcd refuses by default.
		Args: []string{"--strict-reconfig-check=false"},
	})
	if errors.Is(err, etcdproc.ErrNoBinary) {
		t.Skipf("etcd tests skipped: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(proc.Kill)
	core, logs := observer.New(zap.WarnLevel)
	cfg := cluster.Config{Endpoints: []string{proc.Endpoint()}, TTL: steadyTTL, OpTimeout: time.Second, Logger: zap.New(core)}
	p, err := cluster.NewEtcd(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	ctx := ctxT(t)
	_, events, err := p.Watch(ctx, cluster.RoleDecode)
	require.NoError(t, err)

	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{proc.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	_, err = raw.MemberAdd(ctx, []string{"http://127.0.0.1:1"})
	require.NoError(t, err)

	// The leader steps down after an election timeout without quorum;
	// etcd cancels the streams that require a leader after three more.
	bound := 10*electionMs*time.Millisecond + 5*time.Second
	waitLog := func(msg, contains string) {
		t.Helper()
		deadline := time.Now().Add(bound)
		for {
			for _, e := range logs.FilterMessage(msg).All() {
				if strings.Contains(fmt.Sprint(e.ContextMap()["error"]), contains) {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %q log mentioning %q within %v; logs: %v", msg, contains, bound, logs.All())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitLog("cluster: watch interrupted; listing again", "no leader")
	// The listing cannot be served without a leader either: it is retried,
	// and the watch stays open.
	waitLog("cluster: listing for a watch failed; retrying until etcd answers", "")
	select {
	case e, ok := <-events:
		require.True(t, ok, "the watch gave up")
		t.Fatalf("unexpected event %v", e)
	default:
	}
}
