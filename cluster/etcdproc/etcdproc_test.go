package etcdproc_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvstream/kvstream/cluster/etcdproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStopRestartKeepsData: a graceful stop and a restart on the same
// data directory and ports keep what was written.
func TestStopRestartKeepsData(t *testing.T) {
	if _, err := etcdproc.Binary(); err != nil {
		t.Skipf("etcdproc tests skipped: %v", err)
	}
	p, err := etcdproc.Start(etcdproc.Options{DataDir: t.TempDir(), HeartbeatMs: 50, ElectionMs: 500})
	require.NoError(t, err)
	defer p.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Put(ctx, "k", "v")
	require.NoError(t, err)

	p.Stop(5 * time.Second)
	require.NoError(t, p.Restart())
	resp, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "v", string(resp.Kvs[0].Value))
	require.Error(t, p.Restart(), "already running")
}

// TestNoBinary: a missing binary is marked ErrNoBinary, so a test can skip
// and a launcher can say what to install.
func TestNoBinary(t *testing.T) {
	t.Setenv("ETCD_BIN", "/nonexistent/etcd")
	_, err := etcdproc.Start(etcdproc.Options{DataDir: t.TempDir()})
	require.True(t, errors.Is(err, etcdproc.ErrNoBinary), "%v", err)
	require.ErrorContains(t, err, "etcd-server")
	_, err = etcdproc.Start(etcdproc.Options{})
	require.ErrorContains(t, err, "no data directory")
}
