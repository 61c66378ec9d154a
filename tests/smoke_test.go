package tests

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
)

func TestSmoke(t *testing.T) {
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("prefill")
	require.NoError(t, err)
	dec, err := fab.NewTransport("decode")
	require.NoError(t, err)
	defer dec.Close()
	defer pre.Close()
	g := testbed.MLA(4, 64, 32)
	pool, err := testbed.NewPool(g)
	require.NoError(t, err)
	defer pool.Free()
	dpool, err := testbed.NewDecode(dec, g)
	require.NoError(t, err)
	defer dpool.Free()
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	stream := gpu.NewStream("compute")

	eng, err := system.New(system.Config{Buffers: pool.EngineBuffers(), HookLayers: 3, GroupSize: 2, PageSize: 4},
		system.WithStream(stream), system.WithTransport(pre))
	require.NoError(t, err)
	defer eng.Close()
	require.NoError(t, eng.AddPeer(dpool.Peer("d0")))

	src := []int{3, 4, 5, 9}
	dst := []int{10, 11, 20, 21}
	reg, err := eng.Register(context.Background(), system.ChunkSpec{Room: 7, Start: 0, End: 16, Last: true, SrcPages: src, TotalPages: 4,
		Infos: []system.DecodeInfo{{Peer: "d0", DstPages: dst}}})
	require.NoError(t, err)
	require.Equal(t, system.PerLayer, reg.Mode)

	m := &testbed.Model{Stream: stream, Pool: pool, HookLayers: 3, Seed: 1, LayerTime: func(int) time.Duration { return time.Millisecond }}
	require.NoError(t, m.Forward(eng, []testbed.Write{{Room: 7, PageStart: 0, SrcPages: src, Tokens: 16}}))
	res, err := eng.Finish(context.Background(), 7)
	require.NoError(t, err)
	require.Equal(t, system.Succeeded, res.Status)
	t.Logf("stats %+v", res.Stats)
	want := make([]byte, 64)
	for b := 0; b < 4; b++ {
		for pos, dp := range dst {
			testbed.Fill(want, 1, 7, b, pos)
			require.True(t, bytes.Equal(want, dpool.Page(b, dp)), "buffer %d position %d", b, pos)
		}
	}
}
