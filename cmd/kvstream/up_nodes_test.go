package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/internal/twoproc"
	"github.com/kvstream/kvstream/internal/workload"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestRankAsksDiscoveryOncePerSession: a prefill rank running batch after
// batch into a decode instance found through discovery (here the
// in-process provider, behind the counting one the commands use) calls
// the provider once (its watch of the decode role) and opens one session,
// however many batches, requests and forwards it runs.
func TestRankAsksDiscoveryOncePerSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fab := loopback.NewFabric(loopback.Options{})
	decTr, err := fab.NewTransport("decode-0")
	require.NoError(t, err)
	defer decTr.Close()
	preTr, err := fab.NewTransport("g0-r0")
	require.NoError(t, err)
	defer preTr.Close()
	node, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	defer node.Close(context.Background())

	cfg := workload.Defaults()
	cfg.Preset, cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize, cfg.GroupSize = workload.Presets["small"], 2, 500, 128, 16, 4
	cfg.CP = cp.CP{Size: 1}
	rooms := make(chan error, 16)
	d, err := twoproc.StartGroupDecode(node, decTr, 64<<20, decode.Group{Size: 1, PageSize: cfg.PageSize}, 0, "decode-0",
		func(_ decode.Room, err error) { rooms <- err }, nil)
	require.NoError(t, err)
	defer d.Close(context.Background())

	local := cluster.NewLocal()
	defer local.Close()
	reg, err := local.Register(ctx, cluster.Member{ID: "decode-0", Role: cluster.RoleDecode, Addr: node.Addr()})
	require.NoError(t, err)
	defer reg.Close()
	prov := &countingProvider{Provider: local}
	res := cluster.NewResolver(prov)
	defer res.Close()
	require.NoError(t, res.Follow(cluster.RoleDecode))

	var out bytes.Buffer
	k := &rank{cfg: cfg, id: "g0-r0", node: node, tr: preTr, res: res, log: zap.NewNop(),
		out: &eventOut{enc: json.NewEncoder(&out)}, sessions: map[string]*decode.Client{}}
	const batches = 3
	for b := range batches {
		k.run(ctx, b, "decode-0")
	}
	for range batches * cfg.Requests {
		select {
		case err := <-rooms:
			assert.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("rooms did not end")
		}
	}
	k.byeAll()
	row := k.row()
	assert.Equal(t, batches, row.Batches)
	assert.Zero(t, row.FailedChunks)
	assert.Equal(t, int64(1), row.Sessions, "one session for every batch")
	assert.Equal(t, int64(1), prov.calls.Load(), "one watch; nothing per batch, request or forward")
	forwards := bytes.Count(out.Bytes(), []byte(`"event":"forward"`))
	assert.Greater(t, forwards, batches, "several forwards per batch, none of them asking discovery")
	pages, mismatch := d.Verified()
	assert.Empty(t, mismatch)
	assert.Equal(t, uint64(batches*2*32*9), pages)
}
