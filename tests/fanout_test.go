package tests

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestHostedFanOut binds many chunks to one forward, spread over every
// chunk host (actors' host.go), so that each group boundary and the end
// reach them as one queue entry per host, over two forwards: every chunk
// must succeed with exactly its source page's bytes on its decode page, and
// every group must have come as its own boundary before the end (a boundary
// a host lost, or handled after the end, goes with the rest at ForwardEnd;
// an end it lost leaves Finish to time out).
func TestHostedFanOut(t *testing.T) {
	rooms := 197
	g := testbed.MLA(9, 64, 2*rooms) // 8 hook layers and one without a hook
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("p")
	require.NoError(t, err)
	dec, err := fab.NewTransport("d")
	require.NoError(t, err)
	pool, err := testbed.NewPool(g)
	require.NoError(t, err)
	dpool, err := testbed.NewDecode(dec, g)
	require.NoError(t, err)
	eng, err := system.New(system.Config{Buffers: pool.EngineBuffers(), HookLayers: 8, GroupSize: 2, PageSize: 16},
		system.WithStream(lyingStream{}), system.WithTransport(pre), system.WithLogger(zap.NewNop()))
	require.NoError(t, err)
	defer func() {
		require.NoError(t, eng.Close())
		_ = pre.Close()
		_ = dec.Close()
		_ = pool.Free()
		_ = dpool.Free()
	}()
	require.NoError(t, eng.AddPeer(dpool.Peer("d")))
	for b := 0; b < g.Buffers(); b++ {
		for pg := 0; pg < g.Pages; pg++ {
			for i, page := 0, pool.Page(b, pg); i < len(page); i++ {
				page[i] = byte(b*31 + pg*7 + i)
			}
		}
	}
	ctx := context.Background()
	for f := 0; f < 2; f++ {
		for i := 0; i < rooms; i++ {
			// Forward f's room i: source page i (+rooms on the second), a
			// decode page in another order.
			src, dst := f*rooms+i, (f*rooms+(i*7)%rooms)%(2*rooms)
			_, err := eng.Register(ctx, system.ChunkSpec{Room: uint64(f*rooms + i + 1), End: 16, Last: true, SrcPages: []int{src}, TotalPages: 1,
				Infos: []system.DecodeInfo{{Peer: "d", DstPages: []int{dst}}}})
			require.NoError(t, err)
		}
		fw, err := eng.BeginForward()
		require.NoError(t, err)
		for l := 0; l < 8; l++ {
			require.NoError(t, fw.LayerEnd(l))
		}
		require.NoError(t, fw.End())
		for i := 0; i < rooms; i++ {
			res, err := eng.Finish(ctx, uint64(f*rooms+i+1))
			require.NoError(t, err)
			require.Equal(t, system.Succeeded, res.Status, "forward %d room %d: %v", f, i, res.Err)
			// Every group came as its own boundary, before the end: a lost or
			// late GroupReady would have gone with the rest at ForwardEnd.
			require.Equal(t, 4, res.Stats.Groups, "forward %d room %d", f, i)
			require.Equal(t, 5, res.Stats.Batches, "forward %d room %d: 4 groups and the layer without a hook", f, i)
			src, dst := f*rooms+i, (f*rooms+(i*7)%rooms)%(2*rooms)
			for b := 0; b < g.Buffers(); b++ {
				require.True(t, bytes.Equal(pool.Page(b, src), dpool.Page(b, dst)), "forward %d room %d buffer %d", f, i, b)
			}
		}
	}
}
