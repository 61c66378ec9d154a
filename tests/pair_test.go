package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
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

// pairEngine is newLoopbackPair with a prefill engine on its prefill pool:
// one MLA buffer per layer, a group per layer, page size 16, on the virtual
// GPU, quiet. The engine closes at the test's end.
type pairEngine struct {
	node         *decode.Node
	srv          *decode.Server
	dpool, ppool *hostmem.Block
	dst          []int // room 1's decode pages
	cfg          system.Config
	eng          *system.Engine
}

// newPairEngine is a pairEngine whose engine has cfg's finish timeout
// (zero: the default) and opts.
func newPairEngine(t *testing.T, finishTimeout time.Duration, opts ...system.Option) *pairEngine {
	t.Helper()
	node, srv, dpool, prefillTr, ppool, dst := newLoopbackPair(t)
	gpu := sim.New(sim.Options{})
	t.Cleanup(gpu.Close)
	cfg := system.Config{Buffers: system.MLABuffers([]uint64{ppool.Addr, ppool.Addr + pairItemLen*pairPages}, pairItemLen, pairPages),
		HookLayers: pairLayers, GroupSize: 1, PageSize: 16, FinishTimeout: finishTimeout}
	eng, err := system.New(cfg, append([]system.Option{system.WithStream(gpu.NewStream("compute")), system.WithTransport(prefillTr),
		system.WithLogger(zap.NewNop())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = eng.Close() })
	return &pairEngine{node: node, srv: srv, dpool: dpool, ppool: ppool, dst: dst, cfg: cfg, eng: eng}
}

// dial opens a session with the pair's decode server and attaches it to
// the engine.
func (p *pairEngine) dial(ctx context.Context, t *testing.T) *decode.Client {
	t.Helper()
	sess, err := decode.Dial(ctx, p.node, decode.DialConfig{Decode: p.srv.Addr(), Buffers: p.cfg.Buffers, PageSize: p.cfg.PageSize})
	require.NoError(t, err)
	require.NoError(t, sess.Attach(p.eng))
	return sess
}
