package cluster_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdproc"
	"github.com/kvstream/kvstream/cluster/etcdtest"
	"github.com/kvstream/kvstream/netsec"
)

// forge writes a member record with no lease, as anyone who can write to
// etcd can.
func forge(t *testing.T, srv *etcdtest.Server, m cluster.Member) {
	t.Helper()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer raw.Close()
	_, err = raw.Put(ctxT(t), cluster.DefaultPrefix+"/members/"+string(m.Role)+"/"+m.ID,
		`{"id":"`+m.ID+`","role":"`+string(m.Role)+`","addr":"`+m.Addr+`"}`)
	require.NoError(t, err)
}

// observed is a provider whose WARN lines a test reads.
func observed(t *testing.T, srv *etcdtest.Server) (*cluster.Etcd, *observer.ObservedLogs) {
	core, logs := observer.New(zap.WarnLevel)
	return newEtcd(t, srv, func(c *cluster.Config) { c.Logger = zap.New(core) }), logs
}

// TestEtcdIgnoresRecordsWithoutALease: a record no lease holds is not a
// member: listings and watches leave it out, a lookup does not find it,
// and each ignored record is logged once, with why.
func TestEtcdIgnoresRecordsWithoutALease(t *testing.T) {
	srv := etcdtest.Start(t)
	p, logs := observed(t, srv)
	ctx := ctxT(t)
	reg, err := p.Register(ctx, decode("decode-0", "127.0.0.1:9000"))
	require.NoError(t, err)
	defer reg.Close()
	forge(t, srv, decode("decode-9", "127.0.0.1:9009"))

	ms, err := p.List(ctx, cluster.RoleDecode)
	require.NoError(t, err)
	assert.Equal(t, []cluster.Member{decode("decode-0", "127.0.0.1:9000")}, ms)
	_, err = p.List(ctx, cluster.RoleDecode)
	require.NoError(t, err)
	_, err = p.Lookup(ctx, cluster.RoleDecode, "decode-9")
	requireIs(t, err, cluster.ErrNotFound)
	assert.ErrorContains(t, err, "has no lease")
	ignored := logs.FilterMessage("cluster: ignoring a member record").All()
	require.Len(t, ignored, 1, "logged once per record, not per listing")
	assert.Equal(t, cluster.DefaultPrefix+"/members/decode/decode-9", ignored[0].ContextMap()["key"])
	assert.Contains(t, ignored[0].ContextMap()["why"], "no lease")

	initial, events, err := p.Watch(ctx, cluster.RoleDecode)
	require.NoError(t, err)
	assert.Len(t, initial, 1)
	forge(t, srv, decode("decode-8", "127.0.0.1:9008"))
	reg1, err := p.Register(ctx, decode("decode-1", "127.0.0.1:9001"))
	require.NoError(t, err)
	defer reg1.Close()
	// The forged put came first; the watch reports only the member.
	assert.Equal(t, cluster.Event{Kind: cluster.Joined, Member: decode("decode-1", "127.0.0.1:9001")}, next(t, events, 5*time.Second))
}

// TestEtcdRegistersOverARecordWithoutALease: a forged record under a
// member's identity neither blocks nor delays its registration (it once
// counted as live forever): the member takes the key over, and says so.
func TestEtcdRegistersOverARecordWithoutALease(t *testing.T) {
	srv := etcdtest.Start(t)
	p, logs := observed(t, srv)
	forge(t, srv, decode("decode-0", "127.0.0.1:6666"))
	start := time.Now()
	reg, err := p.Register(ctxT(t), decode("decode-0", "127.0.0.1:9000"))
	require.NoError(t, err)
	defer reg.Close()
	assert.Less(t, time.Since(start), steadyTTL, "no wait for a lease that does not exist")
	m, err := p.Lookup(ctxT(t), cluster.RoleDecode, "decode-0")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9000", m.Addr)
	over := logs.FilterMessage("cluster: registered over a record that was not a member's").All()
	require.Len(t, over, 1)
	assert.Contains(t, over[0].ContextMap()["replaced"], "127.0.0.1:6666")
}

// TestEtcdClientTLS: etcd run with client TLS (https, --client-cert-auth)
// serves a provider holding a client certificate of its CA, refuses one
// without it, and an http:// endpoint with TLS configured is refused as
// bad input before anything dials.
func TestEtcdClientTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	files, err := netsec.GenerateDevCerts(dir, []string{"etcd", "etcd-client"}, nil)
	require.NoError(t, err)
	srv := etcdtest.StartTLS(t, etcdproc.TLS{CertFile: files["etcd"].Cert, KeyFile: files["etcd"].Key, CAFile: files["etcd"].CA,
		ClientCertFile: files["etcd-client"].Cert, ClientKeyFile: files["etcd-client"].Key})
	require.Contains(t, srv.Endpoint(), "https://")

	client := cluster.TLSFiles{CA: files["etcd-client"].CA, Cert: files["etcd-client"].Cert, Key: files["etcd-client"].Key}
	tlsc, err := client.Config()
	require.NoError(t, err)
	p := newEtcd(t, srv, func(c *cluster.Config) { c.TLS = tlsc })
	ctx := ctxT(t)
	reg, err := p.Register(ctx, decode("decode-0", "127.0.0.1:9000"))
	require.NoError(t, err)
	m, err := p.Lookup(ctx, cluster.RoleDecode, "decode-0")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9000", m.Addr)
	require.NoError(t, reg.Close())

	caOnly, err := cluster.TLSFiles{CA: client.CA}.Config()
	require.NoError(t, err)
	_, err = cluster.NewEtcd(cluster.Config{Endpoints: []string{srv.Endpoint()}, TLS: caOnly, DialTimeout: time.Second})
	require.Error(t, err, "etcd requires a client certificate")
	_, err = cluster.NewEtcd(cluster.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: time.Second})
	require.Error(t, err, "no TLS at all")

	_, err = cluster.NewEtcd(cluster.Config{Endpoints: []string{"http://127.0.0.1:2379"}, TLS: tlsc})
	requireIs(t, err, cluster.ErrInvalid)
	assert.ErrorContains(t, err, "https://")
	_, err = cluster.TLSFiles{Cert: client.Cert}.Config()
	requireIs(t, err, cluster.ErrInvalid)
	_, err = cluster.TLSFiles{CA: filepath.Join(dir, "none.pem")}.Config()
	assert.ErrorContains(t, err, "none.pem")
}
