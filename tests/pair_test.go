package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
)

// The geometry of newLoopbackPair: two MLA layers of 8 pages of 256 bytes.
const pairLayers, pairItemLen, pairPages = 2, 256, 8

// newLoopbackPair is a decode server and a prefill transport in one process
// over one loopback fabric: the server's node (prefills dial it too), the
// server with its pool (layer l's page p at dpool.Bytes[(l*pages+p)*itemLen:]),
// the prefill transport and pool, and room 1 expected at decode pages dst.
// Everything closes at the test's end (after its own defers), in reverse.
func newLoopbackPair(t *testing.T) (*decode.Node, *decode.Server, *hostmem.Block, rdma.Transport, *hostmem.Block, []int) {
	t.Helper()
	// The cleanups run after the test's own context was cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	fabric := loopback.NewFabric(loopback.Options{})
	node, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close(ctx) })
	decodeTr, err := fabric.NewTransport("decode")
	require.NoError(t, err)
	t.Cleanup(func() { _ = decodeTr.Close() })
	dpool, err := hostmem.Alloc(pairLayers * pairItemLen * pairPages)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dpool.Free() })
	srv, err := decode.New(node, decodeTr, decode.Config{Buffers: []decode.Buffer{
		{Name: "KV0", Base: dpool.Addr, ItemLen: pairItemLen, Pages: pairPages},
		{Name: "KV1", Base: dpool.Addr + pairItemLen*pairPages, ItemLen: pairItemLen, Pages: pairPages},
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close(ctx) })
	dst := []int{5, 2}
	require.NoError(t, srv.Expect(1, dst))

	prefillTr, err := fabric.NewTransport("prefill")
	require.NoError(t, err)
	t.Cleanup(func() { _ = prefillTr.Close() })
	ppool, err := hostmem.Alloc(pairLayers * pairItemLen * pairPages)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ppool.Free() })
	return node, srv, dpool, prefillTr, ppool, dst
}
