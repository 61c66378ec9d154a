package tests

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"pgregory.net/rapid"
)

// scenario is one randomized prefill→decode workload: a pool layout, a CP
// rank, and rooms whose prompts are split into chunks that successive
// forwards write.
type scenario struct {
	mla       bool
	layers    int // layers that own buffers
	hooks     int // F: layers that fire LayerEnd
	itemLen   uint64
	pageSize  int
	group     int
	cp        cp.CP
	layerTime time.Duration
	pages     int // pool capacity per buffer, both sides
	rooms     []roomSpec
}

type roomSpec struct {
	room       uint64
	tokens     int
	chunkEnds  []int // token end of each chunk; the last is tokens
	src        []int // prefill page of each request position
	infos      []infoSpec
	reregister bool // register every chunk twice
	finishLate bool // finish after all forwards instead of after its own
}

type infoSpec struct {
	peer  int // decode pool index
	dummy bool
	dst   []int // decode page of each request position
}

func (r *roomSpec) totalPages(ps int) int { return (r.tokens + ps - 1) / ps }

func (s *scenario) geometry() testbed.Geometry {
	if s.mla {
		return testbed.MLA(s.layers, s.itemLen, s.pages)
	}
	return testbed.KV(s.layers, s.itemLen, s.pages)
}

const decodePools = 2

// drawScenario draws a scenario within the ranges: page sizes 1..128,
// 1..4 chunks per room, CP 1..8 with both rules, MLA and K/V layouts, F
// smaller than the buffer layers, group sizes 1..16, several rooms per
// forward and several forwards.
func drawScenario(t *rapid.T) *scenario {
	s := &scenario{
		mla:       rapid.Bool().Draw(t, "mla"),
		layers:    rapid.IntRange(2, 12).Draw(t, "layers"),
		itemLen:   uint64(rapid.IntRange(1, 48).Draw(t, "itemLen")),
		pageSize:  rapid.SampledFrom([]int{1, 2, 3, 16, 64, 128}).Draw(t, "pageSize"),
		group:     rapid.IntRange(1, 16).Draw(t, "group"),
		layerTime: time.Duration(rapid.IntRange(0, 300).Draw(t, "layerTimeUs")) * time.Microsecond,
	}
	s.hooks = s.layers - rapid.IntRange(0, 1).Draw(t, "hookless") // the MTP layer fires no hook
	s.cp.Size = rapid.IntRange(1, 8).Draw(t, "cp")
	s.cp.Rank = rapid.IntRange(0, s.cp.Size-1).Draw(t, "rank")
	s.cp.Rule = cp.Rule(rapid.IntRange(0, 1).Draw(t, "rule"))

	nRooms := rapid.IntRange(1, 4).Draw(t, "rooms")
	maxTokens := 40 * s.pageSize
	var total struct{ src int }
	for i := 0; i < nRooms; i++ {
		r := roomSpec{room: uint64(100 + i), tokens: rapid.IntRange(1, maxTokens).Draw(t, "tokens")}
		chunks := rapid.IntRange(1, 4).Draw(t, "chunks")
		start := 0
		for c := 0; c < chunks-1; c++ {
			end := rapid.IntRange(start, r.tokens).Draw(t, "chunkEnd")
			end -= end % s.pageSize
			r.chunkEnds = append(r.chunkEnds, end)
			start = end
		}
		r.chunkEnds = append(r.chunkEnds, r.tokens)
		switch rapid.IntRange(0, 5).Draw(t, "infos") {
		case 0: // two real destinations: per layer to both (monolithic under the reference rule)
			r.infos = []infoSpec{{peer: 0}, {peer: 1}}
		case 1: // all dummy: nothing is sent
			r.infos = []infoSpec{{peer: 0, dummy: true}}
		case 2: // one real among dummies: per-layer
			r.infos = []infoSpec{{peer: 1, dummy: true}, {peer: 0}, {peer: 1, dummy: true}}
		default:
			r.infos = []infoSpec{{peer: rapid.IntRange(0, 1).Draw(t, "peer")}}
		}
		r.reregister = rapid.Bool().Draw(t, "reregister")
		r.finishLate = rapid.Bool().Draw(t, "finishLate")
		s.rooms = append(s.rooms, r)
		total.src += r.totalPages(s.pageSize)
	}
	// Pages: each room gets distinct prefill pages; each destination distinct
	// decode pages, partly consecutive so that runs form and break.
	s.pages = total.src + 8
	dstPerm := make([][]int, decodePools)
	for p := range dstPerm {
		dstPerm[p] = seq(s.pages)
		if rapid.Bool().Draw(t, "shuffleDst") {
			dstPerm[p] = rapid.Permutation(dstPerm[p]).Draw(t, "dstPool")
		}
	}
	used := make([]int, decodePools)
	next := 0
	for i := range s.rooms {
		r := &s.rooms[i]
		n := r.totalPages(s.pageSize)
		r.src = seqFrom(next, n) // consecutive source pages: long runs
		if rapid.Bool().Draw(t, "shuffleSrc") {
			r.src = rapid.Permutation(r.src).Draw(t, "src")
		}
		next += n
		for j := range r.infos {
			in := &r.infos[j]
			if in.dummy {
				continue
			}
			in.dst = append([]int(nil), dstPerm[in.peer][used[in.peer]:used[in.peer]+n]...)
			used[in.peer] += n
		}
	}
	return s
}

func seq(n int) []int { return seqFrom(0, n) }

func seqFrom(from, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = from + i
	}
	return s
}

// outcome is what a run left: the decode pools and every chunk result.
type outcome struct {
	decodes []*testbed.Decode
	results []system.Result
	modes   map[uint64]system.Mode
}

// runOpts tweak a run.
type runOpts struct {
	perLayer bool
	// single is Config.SingleDestinationPerLayer: the reference rule.
	single bool
	// wrapStream lets a test falsify the events (to show the oracle catches
	// a transfer that reads before the write).
	wrapStream func(cuda.Stream) cuda.Stream
	log        *zap.Logger
}

// run executes the scenario on a fresh engine and fresh pools.
func run(t require.TestingT, s *scenario, o runOpts) *outcome {
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("prefill")
	require.NoError(t, err)
	defer pre.Close()
	g := s.geometry()
	pool, err := testbed.NewPool(g)
	require.NoError(t, err)
	defer pool.Free()
	// Garbage, not zeros, before the forwards write: a transfer that reads a
	// page before its layer was written copies garbage.
	rng := rand.New(rand.NewPCG(uint64(len(s.rooms)), 7))
	for i := range pool.Block.Bytes {
		pool.Block.Bytes[i] = byte(rng.Uint32())
	}
	out := &outcome{modes: map[uint64]system.Mode{}}
	peers := make([]string, decodePools)
	for p := range peers {
		tr, err := fab.NewTransport(fmt.Sprintf("decode%d", p))
		require.NoError(t, err)
		d, err := testbed.NewDecode(tr, g)
		require.NoError(t, err)
		out.decodes = append(out.decodes, d)
		peers[p] = fmt.Sprintf("d%d", p)
	}
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	stream := gpu.NewStream("compute")
	var engStream cuda.Stream = stream
	if o.wrapStream != nil {
		engStream = o.wrapStream(stream)
	}
	log := o.log
	if log == nil {
		log = zap.NewNop()
	}
	eng, err := system.New(system.Config{
		Buffers: pool.EngineBuffers(), HookLayers: s.hooks, GroupSize: s.group, PageSize: s.pageSize, CP: s.cp,
		DisablePerLayer: !o.perLayer, SingleDestinationPerLayer: o.single, FinishTimeout: 20 * time.Second,
	}, system.WithStream(engStream), system.WithTransport(pre), system.WithLogger(log))
	require.NoError(t, err)
	defer eng.Close()
	for p, d := range out.decodes {
		require.NoError(t, eng.AddPeer(d.Peer(peers[p])))
	}
	model := &testbed.Model{Stream: stream, Pool: pool, HookLayers: s.hooks, Seed: 42,
		LayerTime: func(int) time.Duration { return s.layerTime }}

	ctx := context.Background()
	finish := func(room uint64) {
		res, err := eng.Finish(ctx, room)
		require.NoError(t, err, "finish room %d", room)
		out.results = append(out.results, res)
	}
	var late []uint64
	for k := 0; ; k++ {
		var writes []testbed.Write
		var now []uint64
		for i := range s.rooms {
			r := &s.rooms[i]
			if k >= len(r.chunkEnds) {
				continue
			}
			start := 0
			if k > 0 {
				start = r.chunkEnds[k-1]
			}
			last := k == len(r.chunkEnds)-1
			rg, err := cp.ChunkRange(start, r.chunkEnds[k], s.pageSize, last)
			require.NoError(t, err)
			spec := system.ChunkSpec{Room: r.room, Start: start, End: r.chunkEnds[k], Last: last,
				SrcPages: r.src[rg.PageStart : rg.PageStart+rg.Pages], TotalPages: r.totalPages(s.pageSize)}
			for _, in := range r.infos {
				spec.Infos = append(spec.Infos, system.DecodeInfo{Peer: peers[in.peer], DstPages: in.dst, Dummy: in.dummy})
			}
			reg, err := eng.Register(ctx, spec)
			require.NoError(t, err)
			require.False(t, reg.Existing)
			out.modes[r.room] = reg.Mode
			if r.reregister {
				again, err := eng.Register(ctx, spec)
				require.NoError(t, err)
				require.True(t, again.Existing, "re-registering an active chunk is a no-op")
				require.Equal(t, reg.Chunk, again.Chunk)
			}
			writes = append(writes, testbed.Write{Room: r.room, PageStart: rg.PageStart, SrcPages: spec.SrcPages, Tokens: rg.End - rg.Start})
			if r.finishLate {
				late = append(late, r.room)
			} else {
				now = append(now, r.room)
			}
		}
		if len(writes) == 0 {
			break
		}
		require.NoError(t, model.Forward(eng, writes))
		for _, room := range now {
			finish(room)
		}
	}
	for _, room := range late {
		finish(room)
	}
	return out
}

// owns is an independent statement of the CP rules (not cp's code).
func owns(c cp.CP, pos, total int) bool {
	if c.Rule == cp.SharedKV {
		return pos%c.Size == c.Rank
	}
	lo := 0
	for r := 0; r < c.Size; r++ {
		n := total / c.Size
		if r < total%c.Size {
			n++
		}
		if r == c.Rank {
			return pos >= lo && pos < lo+n
		}
		lo += n
	}
	return false
}

// checkOracle compares every decode page with what it must hold: the
// model's bytes for the owned positions of real destinations, zeros
// everywhere else (no write may land on a page it does not own).
func checkOracle(t require.TestingT, s *scenario, out *outcome) {
	g := s.geometry()
	want := make([][][]byte, decodePools) // pool, buffer*pages+page
	for p := range want {
		want[p] = make([][]byte, g.Buffers()*s.pages)
	}
	for _, r := range s.rooms {
		total := r.totalPages(s.pageSize)
		for _, in := range r.infos {
			if in.dummy {
				continue
			}
			for pos := 0; pos < total; pos++ {
				if !owns(s.cp, pos, total) {
					continue
				}
				for b := 0; b < g.Buffers(); b++ {
					page := make([]byte, s.itemLen)
					testbed.Fill(page, 42, r.room, b, pos)
					want[in.peer][b*s.pages+in.dst[pos]] = page
				}
			}
		}
	}
	zero := make([]byte, s.itemLen)
	for p, d := range out.decodes {
		for b := 0; b < g.Buffers(); b++ {
			for pg := 0; pg < s.pages; pg++ {
				w := want[p][b*s.pages+pg]
				if w == nil {
					w = zero
				}
				if !bytes.Equal(w, d.Page(b, pg)) {
					require.Failf(t, "decode bytes differ", "pool %d buffer %s page %d", p, g.Names[b], pg)
				}
			}
		}
	}
}

func (o *outcome) free() {
	for _, d := range o.decodes {
		_ = d.Transport.Close()
		_ = d.Free()
	}
}

// TestPerLayerEqualsMonolithic is the acceptance oracle (invariant 2): on
// randomized scenarios the per-layer path (to every destination, or under
// the reference rule) leaves decode memory byte-identical to the monolithic
// send, and both equal the model's bytes on exactly the owned pages of the
// real destinations.
func TestPerLayerEqualsMonolithic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawScenario(t)
		single := rapid.Bool().Draw(t, "singleDestinationRule")
		per := run(t, s, runOpts{perLayer: true, single: single})
		defer per.free()
		mono := run(t, s, runOpts{perLayer: false})
		defer mono.free()
		for _, res := range append(per.results, mono.results...) {
			require.Equal(t, system.Succeeded, res.Status, "room %d chunk %d: %v", res.Chunk.Room, res.Chunk.Start, res.Err)
		}
		for i := range per.decodes {
			require.True(t, bytes.Equal(per.decodes[i].Block.Bytes, mono.decodes[i].Block.Bytes), "decode pool %d: per-layer differs from monolithic", i)
		}
		checkOracle(t, s, per)
		for _, r := range s.rooms {
			real := 0
			for _, in := range r.infos {
				if !in.dummy {
					real++
				}
			}
			if real == 1 || real > 1 && !single {
				require.Equal(t, system.PerLayer, per.modes[r.room], "room %d has %d real destinations", r.room, real)
			} else {
				require.Equal(t, system.Monolithic, per.modes[r.room], "room %d has %d real destinations", r.room, real)
			}
			require.Equal(t, system.Monolithic, mono.modes[r.room])
		}
	})
}
