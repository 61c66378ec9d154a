package tests

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/cp/reshard/reshardtest"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/kvstream/kvstream/system/simulated"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"pgregory.net/rapid"
)

// The byte oracle at engine level for resharding: real engines, one per
// prefill rank (PP stage x TP rank x CP rank), each with its own
// Config.Sharding, stream one request chunk by chunk over the loopback
// fabric into decode pools, one per decode rank, each added to every engine
// as a peer with its Sharding. Every decode byte is compared with
// reshardtest's whole-tensor reference, gathered from what the engines'
// models actually wrote into the prefill pools; per layer and monolithic
// must both equal it.

// reshardWorld is one request on a pairing.
type reshardWorld struct {
	req      reshardtest.Request // the reference's view
	pair     reshard.Pairing     // the engines' view of the same sides
	ends     []int               // chunk ends in tokens; the last is Tokens
	group    int
	hookless bool // the last layer of every prefill stage fires no hook (MTP)
	// mistake, when set, plants an engine-level error before the run.
	mistake func(m *reshardRun)
}

// reshardRun is what one run builds; a planted mistake edits it.
type reshardRun struct {
	peers   []system.Peer // per decode rank, as added to every engine
	configs []system.Config
	ranks   []reshardtest.Rank // per engine
}

func toRef(s *reshard.Side) reshardtest.Side {
	return reshardtest.Side{Layers: s.Layers, KVHeads: s.KVHeads, HeadDim: s.HeadDim, ElemBytes: s.ElemBytes, MLA: s.MLA,
		TP: s.TP, Stages: s.Stages, PageSize: s.PageSize, HeadMajor: s.Order == reshard.HeadMajor}
}

// geometry is a rank's pool on side s, stage st: testbed's layout, every
// layer's K then every layer's V (MLA: one per layer), layers numbered within
// the stage.
func geometry(s *reshard.Side, st, pages int) testbed.Geometry {
	lo, hi := s.StageLayers(st)
	if s.MLA {
		return testbed.MLA(hi-lo, s.ItemLen(), pages)
	}
	return testbed.KV(hi-lo, s.ItemLen(), pages)
}

// bufOf converts reshardtest's buffer index (layer * kinds + kind) to the
// pool's (kind * layers + layer).
func bufOf(kinds, layers, i int) int { return i%kinds*layers + i/kinds }

// runReshard runs the world on fresh engines and pools and returns an error
// naming the first decode byte that differs from the reference (nil if none).
func runReshard(t require.TestingT, w *reshardWorld, perLayer bool) error {
	pre, dec := &w.pair.Prefill, &w.pair.Decode
	ref := &w.req
	fab := loopback.NewFabric(loopback.Options{})
	gpu := sim.New(sim.Options{})
	var pools []*testbed.Pool
	defer func() {
		gpu.Close() // no kernel writes a pool any more
		for _, p := range pools {
			_ = p.Free()
		}
	}()

	// Decode pools, one per decode rank (index stage * TP + TP rank).
	var decodes []*testbed.Decode
	run := &reshardRun{}
	for st := 0; st < dec.PP(); st++ {
		for tp := 0; tp < dec.TP; tp++ {
			tr, err := fab.NewTransport(fmt.Sprintf("decode%d.%d", st, tp))
			require.NoError(t, err)
			d, err := testbed.NewDecode(tr, geometry(dec, st, ref.DstPool))
			require.NoError(t, err)
			defer func() { _ = tr.Close(); _ = d.Free() }()
			decodes = append(decodes, d)
			p := d.Peer(fmt.Sprintf("d%d.%d", st, tp))
			p.Sharding = &system.Sharding{Side: *dec, Rank: reshard.Rank{TP: tp, Stage: st}}
			run.peers = append(run.peers, p)
		}
	}
	// Prefill engines' configurations, one per rank.
	rng := rand.New(rand.NewPCG(uint64(ref.Tokens), 3))
	for st := 0; st < pre.PP(); st++ {
		lo, hi := pre.StageLayers(st)
		hooks := hi - lo
		if w.hookless && hooks > 1 {
			hooks--
		}
		for tp := 0; tp < pre.TP; tp++ {
			for c := 0; c < ref.CPSize; c++ {
				pool, err := testbed.NewPool(geometry(pre, st, ref.SrcPool))
				require.NoError(t, err)
				for i := range pool.Block.Bytes { // stale bytes: a read before the write copies garbage
					pool.Block.Bytes[i] = byte(rng.Uint32())
				}
				pools = append(pools, pool)
				run.ranks = append(run.ranks, reshardtest.Rank{Stage: st, TP: tp, CP: c})
				run.configs = append(run.configs, system.Config{
					Buffers: pool.EngineBuffers(), HookLayers: hooks, GroupSize: w.group, PageSize: pre.PageSize,
					CP:       cp.CP{Size: ref.CPSize, Rank: c, Rule: ref.CPRule},
					Sharding: &system.Sharding{Side: *pre, Rank: reshard.Rank{TP: tp, Stage: st}}, Replicas: w.pair.Replicas,
					DisablePerLayer: !perLayer, FinishTimeout: 20 * time.Second,
				})
			}
		}
	}
	if w.mistake != nil {
		w.mistake(run)
	}
	// The engines and their models.
	type engine struct {
		eng    *system.Engine
		model  *testbed.Model
		stream *sim.Stream
	}
	var engines []engine
	kinds := pre.Kinds()
	for i, cfg := range run.configs {
		tr, err := fab.NewTransport(fmt.Sprintf("prefill%d", i))
		require.NoError(t, err)
		defer func() { _ = tr.Close() }()
		stream := gpu.NewStream(fmt.Sprintf("compute%d", i))
		eng, err := system.New(cfg, system.WithStream(stream), system.WithTransport(tr), system.WithLogger(zap.NewNop()),
			system.WithGetenv(func(string) string { return "" }))
		require.NoError(t, err)
		defer func() { _ = eng.Close() }()
		for _, p := range run.peers {
			require.NoError(t, eng.AddPeer(p))
		}
		rank := run.ranks[i]
		lo, hi := pre.StageLayers(rank.Stage)
		side := toRef(pre)
		model := &testbed.Model{Stream: stream, Pool: pools[i], HookLayers: cfg.HookLayers,
			Fill: func(dst []byte, _ uint64, b, pos int) {
				layer, kind := b%(hi-lo), b/(hi-lo) // KV: K0..K(n-1), V0..V(n-1)
				if kinds == 1 {
					layer, kind = b, 0
				}
				side.FillPage(dst, rank.TP, lo+layer, kind, pos)
			}}
		engines = append(engines, engine{eng, model, stream})
	}
	// The request, chunk by chunk: every engine registers the chunk with one
	// destination per decode rank, runs its forward, then finishes.
	ctx := context.Background()
	start := 0
	total := ref.Pages()
	for k, end := range w.ends {
		last := k == len(w.ends)-1
		rg, err := cp.ChunkRange(start, end, pre.PageSize, last)
		require.NoError(t, err)
		spec := system.ChunkSpec{Room: 1, Start: start, End: end, Last: last,
			SrcPages: ref.SrcPages[rg.PageStart : rg.PageStart+rg.Pages], TotalPages: total}
		for di, p := range run.peers {
			spec.Infos = append(spec.Infos, system.DecodeInfo{Peer: p.ID, DstPages: ref.DstPages[di]})
		}
		for _, e := range engines {
			reg, err := e.eng.Register(ctx, spec)
			require.NoError(t, err)
			// Per layer whenever this rank routes anything to some decode
			// rank, to all of them at once; monolithic when asked.
			require.Equal(t, perLayer && reg.Reason != cp.AllDummy, reg.Mode == system.PerLayer, "%+v", reg)
			require.NoError(t, e.model.Forward(e.eng, []testbed.Write{{Room: 1, PageStart: rg.PageStart, SrcPages: spec.SrcPages, Tokens: rg.End - rg.Start}}))
		}
		for _, e := range engines {
			res, err := e.eng.Finish(ctx, 1)
			require.NoError(t, err)
			require.Equal(t, system.Succeeded, res.Status)
		}
		start = rg.End
	}
	// The reference, from what the models wrote: an engine this rank routes
	// nothing from answered Finish without waiting for its kernels.
	for _, e := range engines {
		require.NoError(t, e.stream.Synchronize(ctx))
	}
	src := map[reshardtest.Rank]reshardtest.Bufs{}
	for i, pool := range pools {
		per := int(pool.ItemLen) * pool.Pages
		bufs := make(reshardtest.Bufs, pool.Buffers())
		for j := range bufs {
			b := bufOf(kinds, pool.Buffers()/kinds, j)
			bufs[j] = pool.Block.Bytes[b*per : (b+1)*per]
		}
		src[run.ranks[i]] = bufs
	}
	want, _ := ref.Reference(src)
	for di, d := range decodes {
		n := d.Buffers() / kinds
		for j, wb := range want[di] {
			b := bufOf(kinds, n, j)
			per := int(d.ItemLen) * d.Pages
			got := d.Block.Bytes[b*per : (b+1)*per]
			if !bytes.Equal(wb, got) {
				i := 0
				for wb[i] == got[i] {
					i++
				}
				return errors.Newf("decode rank %d.%d buffer %s byte %d (page %d): got %d, want %d",
					di/dec.TP, di%dec.TP, d.Names[b], i, i/int(d.ItemLen), got[i], wb[i])
			}
		}
	}
	return nil
}

// reshardPairs are issue 17's pairings.
var reshardPairs = []struct {
	name     string
	heads    int
	pre, dec int
	mla      bool
}{
	{"GQA 8 heads TP 8->16", 8, 8, 16, false},
	{"GQA 8 heads TP 16->8", 8, 16, 8, false},
	{"GQA 8 heads TP 4->8", 8, 4, 8, false},
	{"GQA 8 heads TP 1->2", 8, 1, 2, false},
	{"GQA 8 heads TP 2->2", 8, 2, 2, false},
	{"MLA TP 8->16", 1, 8, 16, true},
}

func drawCut(t *rapid.T, layers int, label string) []int {
	if layers < 2 || rapid.IntRange(0, 2).Draw(t, label) > 0 {
		return nil
	}
	return []int{0, rapid.IntRange(1, layers-1).Draw(t, label+"Cut"), layers}
}

// drawReshardWorld draws a world on a named pairing: layers, head size,
// page size and orders, PP cuts (while the engines stay few), CP and its
// rule, chunking, replica rule and scattered page tables.
func drawReshardWorld(t *rapid.T) *reshardWorld {
	np := reshardPairs[rapid.IntRange(0, len(reshardPairs)-1).Draw(t, "pair")]
	layers := rapid.IntRange(1, 4).Draw(t, "layers")
	side := reshard.Side{Layers: layers, KVHeads: np.heads, MLA: np.mla,
		HeadDim: rapid.IntRange(1, 3).Draw(t, "headDim"), ElemBytes: rapid.IntRange(1, 2).Draw(t, "elemBytes"),
		PageSize: rapid.SampledFrom([]int{1, 2, 4, 16}).Draw(t, "pageSize")}
	pre, dec := side, side
	pre.TP, dec.TP = np.pre, np.dec
	pre.Order = reshard.Order(rapid.IntRange(0, 1).Draw(t, "orderP"))
	dec.Order = reshard.Order(rapid.IntRange(0, 1).Draw(t, "orderD"))
	dec.Stages = drawCut(t, layers, "stagesD")
	cpSize := 1
	if np.pre <= 8 {
		cpSize = rapid.IntRange(1, 2).Draw(t, "cp")
	}
	if np.pre*cpSize <= 4 {
		pre.Stages = drawCut(t, layers, "stagesP")
	}
	w := &reshardWorld{
		pair:     reshard.Pairing{Prefill: pre, Decode: dec, Replicas: reshard.ReplicaRule(rapid.IntRange(0, 1).Draw(t, "replicas"))},
		group:    rapid.IntRange(1, 3).Draw(t, "group"),
		hookless: rapid.Bool().Draw(t, "hookless"),
	}
	tokens := rapid.IntRange(1, 40).Draw(t, "tokens")
	w.req = reshardtest.Request{Prefill: toRef(&pre), Decode: toRef(&dec), CPSize: cpSize,
		CPRule: cp.Rule(rapid.IntRange(0, 1).Draw(t, "cpRule")), Tokens: tokens}
	start := 0
	for k := rapid.IntRange(1, 3).Draw(t, "chunks"); k > 1 && start < tokens; k-- {
		end := start + rapid.IntRange(0, tokens-start).Draw(t, "chunkLen")
		w.ends = append(w.ends, end)
		start = end - end%side.PageSize
	}
	w.ends = append(w.ends, tokens)
	T := w.req.Pages()
	w.req.SrcPool = T + rapid.IntRange(0, 2).Draw(t, "srcExtra")
	w.req.SrcPages = drawPages(t, w.req.SrcPool, T, "srcPages")
	w.req.DstPool = T + rapid.IntRange(0, 2).Draw(t, "dstExtra")
	for range dec.PP() * dec.TP {
		w.req.DstPages = append(w.req.DstPages, drawPages(t, w.req.DstPool, T, "dstPages"))
	}
	return w
}

func drawPages(t *rapid.T, pool, n int, label string) []int {
	all := seq(pool)
	if rapid.Bool().Draw(t, label+"Scattered") {
		all = rapid.Permutation(all).Draw(t, label)
	}
	return all[:n]
}

// TestReshardEnginesEqualReference: on issue 17's pairings, engines
// streaming per layer and engines sending monolithically both leave every
// decode byte equal to the whole-tensor reference (and so to each other).
func TestReshardEnginesEqualReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawReshardWorld(t)
		require.NoError(t, runReshard(t, w, true), "per layer")
		require.NoError(t, runReshard(t, w, false), "monolithic")
	})
}

// fixedReshardWorld is TP 2 -> 4 with 8 KV heads over 3 layers, one CP
// rank, 12 tokens in two chunks at page size 2, head-major prefill and
// token-major decode pages, every page table scattered.
func fixedReshardWorld() *reshardWorld {
	side := reshard.Side{Layers: 3, KVHeads: 8, HeadDim: 1, ElemBytes: 2, PageSize: 2}
	pre, dec := side, side
	pre.TP, dec.TP, pre.Order = 2, 4, reshard.HeadMajor
	w := &reshardWorld{pair: reshard.Pairing{Prefill: pre, Decode: dec}, ends: []int{4, 12}, group: 2, hookless: true}
	w.req = reshardtest.Request{Prefill: toRef(&pre), Decode: toRef(&dec), CPSize: 1, Tokens: 12, SrcPool: 8, DstPool: 8,
		SrcPages: []int{7, 5, 3, 1, 0, 2}}
	for d := 0; d < 4; d++ {
		w.req.DstPages = append(w.req.DstPages, []int{(d + 5) % 8, (d + 2) % 8, (d + 7) % 8, d % 8, (d + 4) % 8, (d + 1) % 8})
	}
	return w
}

// TestReshardEngineOracleCatchesMistakes: engine-level mistakes that a plan
// oracle cannot see, each caught by the engine-level oracle, per layer and
// monolithic.
func TestReshardEngineOracleCatchesMistakes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mistake func(m *reshardRun)
		want    string
	}{
		{"the correct run passes", nil, ""},
		{"a decode peer lists its buffers interleaved (K0 V0 K1 ...): routes land in the wrong decode buffer", func(m *reshardRun) {
			p := &m.peers[2]
			bufs := append([]system.PeerBuffer(nil), p.Buffers...)
			for l := 0; l < 3; l++ {
				p.Buffers[2*l], p.Buffers[2*l+1] = bufs[l], bufs[3+l]
			}
		}, "decode rank 0.2 buffer"},
		{"two prefill engines told each other's TP rank send their heads as the other's", func(m *reshardRun) {
			m.configs[0].Sharding, m.configs[1].Sharding = m.configs[1].Sharding, m.configs[0].Sharding
		}, "decode rank 0.0 buffer K0"},
	} {
		for _, perLayer := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/per-layer=%v", tc.name, perLayer), func(t *testing.T) {
				w := fixedReshardWorld()
				w.mistake = tc.mistake
				err := runReshard(t, w, perLayer)
				if tc.want == "" {
					require.NoError(t, err)
					return
				}
				require.Error(t, err, "the oracle passed a wrong run")
				assert.Contains(t, err.Error(), tc.want)
			})
		}
	}
}

// TestAddPeerRefusesImpossiblePairings: AddPeer names what cannot reshard.
func TestAddPeerRefusesImpossiblePairings(t *testing.T) {
	side := reshard.Side{Layers: 2, KVHeads: 8, HeadDim: 2, ElemBytes: 2, TP: 2, PageSize: 4}
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("p")
	require.NoError(t, err)
	defer pre.Close()
	pool, err := testbed.NewPool(geometry(&side, 0, 8))
	require.NoError(t, err)
	defer pool.Free()
	eng, err := system.New(system.Config{Buffers: pool.EngineBuffers(), HookLayers: 2, PageSize: 4,
		Sharding: &system.Sharding{Side: side}}, system.WithTransport(pre), system.WithHardware(simulated.Hardware()), system.WithLogger(zap.NewNop()))
	require.NoError(t, err)
	defer eng.Close()
	for _, tc := range []struct {
		name string
		edit func(s *reshard.Side)
		want string
	}{
		{"heads do not split", func(s *reshard.Side) { s.TP = 3 }, "decode: 8 KV heads do not split over TP 3"},
		{"head dims differ", func(s *reshard.Side) { s.HeadDim = 4 }, "prefill head dim 2, decode 4"},
		{"dtypes differ", func(s *reshard.Side) { s.ElemBytes = 1 }, "prefill dtype of 2 bytes, decode 1 bytes"},
		{"page sizes differ", func(s *reshard.Side) { s.PageSize = 8 }, "prefill page size 4, decode 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := side
			tc.edit(&dec)
			tr, err := fab.NewTransport("d-" + tc.name)
			require.NoError(t, err)
			defer tr.Close()
			d, err := testbed.NewDecode(tr, testbed.KV(2, dec.ItemLen(), 8))
			require.NoError(t, err)
			defer d.Free()
			p := d.Peer("d")
			p.Sharding = &system.Sharding{Side: dec}
			err = eng.AddPeer(p)
			require.Error(t, err)
			assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), `peer "d": `+tc.want)
		})
	}
}

// TestNewRefusesBuffersThatDoNotMatchTheSharding: the prefill buffers must be
// the stage's layers, of the side's item length.
func TestNewRefusesBuffersThatDoNotMatchTheSharding(t *testing.T) {
	side := reshard.Side{Layers: 4, KVHeads: 8, HeadDim: 2, ElemBytes: 2, TP: 2, PageSize: 4, Stages: []int{0, 2, 4}}
	pool, err := testbed.NewPool(geometry(&side, 0, 8)) // stage 0: 2 layers
	require.NoError(t, err)
	defer pool.Free()
	for _, tc := range []struct {
		name string
		edit func(c *system.Config)
		want string
	}{
		{"another stage's layer count", func(c *system.Config) { c.Sharding.Side.Stages = []int{0, 3, 4} }, "4 buffers, PP stage 0 holds 3 layers x 2 buffers"},
		{"another TP degree's item length", func(c *system.Config) { c.Sharding.Side.TP = 4 }, "item length 64, the prefill sharding gives 32 (page 4 x 2 heads x 4 bytes)"},
		{"a page size other than the engine's", func(c *system.Config) { c.PageSize = 8 }, "page size 4, the layout's 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := side
			cfg := system.Config{Buffers: pool.EngineBuffers(), HookLayers: 2, PageSize: 4, Sharding: &system.Sharding{Side: s}}
			tc.edit(&cfg)
			_, err := system.New(cfg, system.WithHardware(simulated.Hardware()), system.WithLogger(zap.NewNop()))
			require.Error(t, err)
			assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
