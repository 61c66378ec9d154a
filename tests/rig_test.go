package tests

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// rig is one prefill engine with a virtual GPU, a loopback fabric and
// decode pools, for the named scenarios of the commit log.
type rig struct {
	t       *testing.T
	eng     *system.Engine
	pool    *testbed.Pool
	decodes []*testbed.Decode
	model   *testbed.Model
	stream  *sim.Stream
	geom    testbed.Geometry
	cfg     system.Config

	mu       sync.Mutex
	landings []loopback.Landing
	spans    []sim.Span
}

type rigOpts struct {
	geom       testbed.Geometry
	hooks      int
	group      int
	pageSize   int
	cp         cp.CP
	decodes    int
	layerTime  time.Duration
	timeout    time.Duration
	perLayer   *bool
	single     bool // Config.SingleDestinationPerLayer
	gpuFaults  func(sim.EventInfo) sim.Fault
	netFaults  func(rdmafault.BatchInfo) rdmafault.Fault
	link       loopback.Options
	log        *zap.Logger
	trace      io.Writer // record a message trace, written when the engine closes
	wrap       func(rdma.Transport) rdma.Transport
	submitters int
	opts       []system.Option // more engine options
}

func newRig(t *testing.T, o rigOpts) *rig {
	t.Helper()
	if o.decodes == 0 {
		o.decodes = 1
	}
	if o.pageSize == 0 {
		o.pageSize = 4
	}
	if o.timeout == 0 {
		o.timeout = 10 * time.Second
	}
	r := &rig{t: t, geom: o.geom}
	link := o.link
	link.OnLand = func(l loopback.Landing) { r.mu.Lock(); r.landings = append(r.landings, l); r.mu.Unlock() }
	fab := loopback.NewFabric(link)
	pre, err := fab.NewTransport("prefill")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pre.Close() })
	r.pool, err = testbed.NewPool(o.geom)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.pool.Free() })
	for i := range r.pool.Block.Bytes {
		r.pool.Block.Bytes[i] = 0xEE // stale bytes before the forward writes
	}
	for i := 0; i < o.decodes; i++ {
		tr, err := fab.NewTransport(fmt.Sprintf("decode%d", i))
		require.NoError(t, err)
		d, err := testbed.NewDecode(tr, o.geom)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close(); _ = d.Free() })
		r.decodes = append(r.decodes, d)
	}
	gpu := sim.New(sim.Options{Faults: o.gpuFaults, OnSpan: func(s sim.Span) { r.mu.Lock(); r.spans = append(r.spans, s); r.mu.Unlock() }})
	t.Cleanup(gpu.Close)
	r.stream = gpu.NewStream("compute")
	log := o.log
	if log == nil {
		log = zap.NewNop()
	}
	r.cfg = system.Config{Buffers: r.pool.EngineBuffers(), HookLayers: o.hooks, GroupSize: o.group, PageSize: o.pageSize,
		CP: o.cp, FinishTimeout: o.timeout, Submitters: o.submitters}
	r.cfg.SingleDestinationPerLayer = o.single
	if o.perLayer != nil && !*o.perLayer {
		r.cfg.DisablePerLayer = true
	}
	var tr rdma.Transport = pre
	if o.netFaults != nil {
		tr = rdmafault.Wrap(pre, o.netFaults)
	}
	if o.wrap != nil {
		tr = o.wrap(tr)
	}
	opts := []system.Option{system.WithStream(r.stream), system.WithTransport(tr), system.WithLogger(log),
		system.WithGetenv(func(string) string { return "" })}
	if o.trace != nil {
		opts = append(opts, system.WithTrace(o.trace, 0))
	}
	opts = append(opts, o.opts...)
	r.eng, err = system.New(r.cfg, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.eng.Close() })
	for i, d := range r.decodes {
		require.NoError(t, r.eng.AddPeer(d.Peer(fmt.Sprintf("d%d", i))))
	}
	r.model = &testbed.Model{Stream: r.stream, Pool: r.pool, HookLayers: o.hooks, Seed: 99,
		LayerTime: func(int) time.Duration { return o.layerTime }}
	return r
}

// chunk is a registration helper: one real destination on decode pool 0
// unless infos says otherwise.
type chunk struct {
	room       uint64
	start, end int
	last       bool
	src        []int
	total      int
	infos      []system.DecodeInfo
}

func (r *rig) spec(c chunk) system.ChunkSpec {
	return system.ChunkSpec{Room: c.room, Start: c.start, End: c.end, Last: c.last, SrcPages: c.src, TotalPages: c.total, Infos: c.infos}
}

func (r *rig) register(c chunk) system.Registration {
	r.t.Helper()
	reg, err := r.eng.Register(context.Background(), r.spec(c))
	require.NoError(r.t, err)
	return reg
}

func (r *rig) forward(writes ...testbed.Write) {
	r.t.Helper()
	require.NoError(r.t, r.model.Forward(r.eng, writes))
}

func (r *rig) finish(room uint64) system.Result {
	r.t.Helper()
	res, err := r.eng.Finish(context.Background(), room)
	require.NoError(r.t, err)
	require.Equal(r.t, system.Succeeded, res.Status)
	return res
}

// expectPages checks that decode pool d holds the model's bytes of room at
// positions pos on pages dst, in every buffer.
func (r *rig) expectPages(d int, room uint64, pos, dst []int) {
	r.t.Helper()
	want := make([]byte, r.geom.ItemLen)
	for b := 0; b < r.geom.Buffers(); b++ {
		for i, p := range pos {
			testbed.Fill(want, 99, room, b, p)
			require.True(r.t, bytes.Equal(want, r.decodes[d].Page(b, dst[i])), "pool %d buffer %s position %d page %d", d, r.geom.Names[b], p, dst[i])
		}
	}
}

// expectZero checks that decode pool d has nothing on pages.
func (r *rig) expectZero(d int, pages []int) {
	r.t.Helper()
	zero := make([]byte, r.geom.ItemLen)
	for b := 0; b < r.geom.Buffers(); b++ {
		for _, p := range pages {
			require.True(r.t, bytes.Equal(zero, r.decodes[d].Page(b, p)), "pool %d buffer %s page %d must be untouched", d, r.geom.Names[b], p)
		}
	}
}

func oneInfo(peer string, dst []int) []system.DecodeInfo {
	return []system.DecodeInfo{{Peer: peer, DstPages: dst}}
}
