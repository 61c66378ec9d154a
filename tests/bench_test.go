package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// benchEngine returns an engine over an MLA pool of 79 buffers (78 hooks,
// K = 8) with n single-page chunks registered and a forward begun. Events
// come from a stream whose events are complete at once, so that the figures
// exclude the driver's event record, as the target in docs/PERFORMANCE.md does.
func benchEngine(b *testing.B, n int) (*system.Engine, *system.Forward) {
	g := testbed.MLA(79, 64, n+1)
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("p")
	require.NoError(b, err)
	dec, err := fab.NewTransport("d")
	require.NoError(b, err)
	pool, err := testbed.NewPool(g)
	require.NoError(b, err)
	dpool, err := testbed.NewDecode(dec, g)
	require.NoError(b, err)
	eng, err := system.New(system.Config{Buffers: pool.EngineBuffers(), HookLayers: 78, GroupSize: 8, PageSize: 16},
		system.WithStream(lyingStream{}), system.WithTransport(pre), system.WithLogger(zap.NewNop()))
	require.NoError(b, err)
	b.Cleanup(func() { _ = eng.Close(); _ = pre.Close(); _ = dec.Close(); _ = pool.Free(); _ = dpool.Free() })
	require.NoError(b, eng.AddPeer(dpool.Peer("d")))
	for i := 0; i < n; i++ {
		_, err := eng.Register(context.Background(), system.ChunkSpec{Room: uint64(i + 1), End: 16, Last: true, SrcPages: []int{i}, TotalPages: 1,
			Infos: []system.DecodeInfo{{Peer: "d", DstPages: []int{i}}}})
		require.NoError(b, err)
	}
	fw, err := eng.BeginForward()
	require.NoError(b, err)
	return eng, fw
}

// BenchmarkLayerEndNonBoundary is the forward thread's cost at a layer that
// closes no group (target: ≤ 20 ns, 0 allocations).
func BenchmarkLayerEndNonBoundary(b *testing.B) {
	_, fw := benchEngine(b, 10)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := fw.LayerEnd(i % 7); err != nil { // layers 0..6 of group 0
			b.Fatal(err)
		}
	}
}

// BenchmarkLayerEndBoundary is the forward thread's cost at a group boundary
// with n active contexts (target: ≤ 2 µs + 200 ns per context): one event
// record and one enqueue per context. Repeated boundaries of the same group
// are deduplicated by the chunks, so the loop measures the fan-out itself.
func BenchmarkLayerEndBoundary(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("contexts=%d", n), func(b *testing.B) {
			_, fw := benchEngine(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := fw.LayerEnd(7); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRegisterExisting is a re-registration of an active chunk, which
// the scheduler does ~9x per request while forming a batch.
func BenchmarkRegisterExisting(b *testing.B) {
	eng, _ := benchEngine(b, 1)
	spec := system.ChunkSpec{Room: 1, End: 16, Last: true, SrcPages: []int{0}, TotalPages: 1,
		Infos: []system.DecodeInfo{{Peer: "d", DstPages: []int{0}}}}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		reg, err := eng.Register(ctx, spec)
		if err != nil || !reg.Existing {
			b.Fatal(err, reg)
		}
	}
}

// BenchmarkPlan100k builds the plan of a 100k-token chunk at page size 1
// (owner filter, destination mapping, runs), for CP 1 and CP 8 shared-KV,
// with consecutive decode pages, shuffled ones (every page its own run) and
// runs of 16 pages in shuffled order; toward the 32 ranks of a decode TP
// group (equal page lists, each its own slice), and toward 32 destinations
// with 32 different lists (32 decode instances, or ranks whose pools
// differ). cpu-ms/op is the process's CPU time, every thread's: with
// GOMAXPROCS above 1 a plan of many destinations spreads them over
// goroutines (-cpu 1,2 shows both).
func BenchmarkPlan100k(b *testing.B) {
	const tokens = 100_000
	for _, tc := range []struct {
		name     string
		cp       int
		run      int  // decode pages in runs of run consecutive pages, the runs shuffled; 0: all consecutive
		dests    int  // destinations
		distinct bool // each destination its own order of the runs, else one list for all (each its own slice)
	}{{"cp1/consecutive", 1, 0, 1, false}, {"cp1/shuffled", 1, 1, 1, false}, {"cp8/shuffled", 8, 1, 1, false},
		{"cp1/shuffled/tp32", 1, 1, 32, false}, {"cp1/shuffled/tp32-distinct", 1, 1, 32, true},
		{"cp1/runs16/tp32", 1, 16, 32, false}, {"cp1/runs16/tp32-distinct", 1, 16, 32, true}} {
		b.Run(tc.name, func(b *testing.B) {
			bufs := make([]plan.Buffer, 61)
			keys := make([]rdma.LocalKey, 61)
			for i := range bufs {
				bufs[i] = plan.Buffer{Base: uint64(i+1) << 32, ItemLen: 1152, Pages: tokens, Layer: i}
			}
			l, err := plan.NewLayout(bufs, keys, 61, 8, 1, cp.CP{Size: tc.cp})
			require.NoError(b, err)
			rng := rand.New(rand.NewPCG(1, 2))
			list := func() []int {
				if tc.run == 0 {
					return seq(tokens)
				}
				out := make([]int, 0, tokens)
				for _, blk := range rng.Perm((tokens + tc.run - 1) / tc.run) {
					for p := blk * tc.run; p < min((blk+1)*tc.run, tokens); p++ {
						out = append(out, p)
					}
				}
				return out
			}
			peer := &plan.Peer{ID: "d", Buffers: make([]plan.PeerBuffer, 61)}
			for i := range peer.Buffers {
				peer.Buffers[i] = plan.PeerBuffer{Region: rdma.RegionDesc{Len: 1152 * tokens}, ItemLen: 1152}
			}
			spec := &plan.ChunkSpec{Room: 1, End: tokens, Last: true, SrcPages: seq(tokens), TotalPages: tokens}
			dst := list()
			for d := range tc.dests {
				if tc.distinct && d > 0 {
					dst = list()
				}
				spec.Infos = append(spec.Infos, plan.DecodeInfo{Peer: "d", DstPages: slices.Clone(dst)})
			}
			get := func(string) (*plan.Peer, bool) { return peer, true }
			b.ReportAllocs()
			b.ResetTimer()
			var runs int
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				p, err := plan.BuildPlan(l, get, spec, cp.EveryDestination)
				if err != nil {
					b.Fatal(err)
				}
				runs = len(p.Dests[0].Runs)
			}
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/1e6/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(runs), "runs")
		})
	}
}

// processCPU is the CPU time this process used so far, every thread's.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBlocks100k turns the runs of a 100k-page chunk into one buffer's
// blocks, as a submitter does per buffer of a group (allocation-free once
// the slice has grown).
func BenchmarkBlocks100k(b *testing.B) {
	for _, shuffle := range []bool{false, true} {
		b.Run(fmt.Sprintf("shuffled=%v", shuffle), func(b *testing.B) {
			dst := seq(100_000)
			if shuffle {
				rand.New(rand.NewPCG(1, 2)).Shuffle(len(dst), func(i, j int) { dst[i], dst[j] = dst[j], dst[i] })
			}
			runs, err := cp.Coalesce(seq(100_000), dst)
			require.NoError(b, err)
			var blocks []cp.Block
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				blocks = cp.AppendBlocks(blocks[:0], runs, 1<<32, 1<<40, 1152)
			}
			b.ReportMetric(float64(len(blocks)), "blocks")
		})
	}
}

// landedObserver signals when a chunk's batches all completed.
type landedObserver struct {
	system.NopObserver
	want int
	mu   sync.Mutex
	n    map[uint64]int
	done chan uint64
}

func (o *landedObserver) Batch(b actors.Batch) {
	o.mu.Lock()
	o.n[b.Chunk.Room]++
	full := o.n[b.Chunk.Room] == o.want
	o.mu.Unlock()
	if full {
		o.done <- b.Chunk.Room
	}
}

// BenchmarkFinishAfterLanded is Finish's latency when every write of the
// chunk already completed (target: p99 ≤ 100 µs, docs/PERFORMANCE.md): the round trip
// through manager, room and chunk actors and back.
func BenchmarkFinishAfterLanded(b *testing.B) {
	g := testbed.MLA(9, 64, 8)
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("p")
	require.NoError(b, err)
	dec, err := fab.NewTransport("d")
	require.NoError(b, err)
	pool, err := testbed.NewPool(g)
	require.NoError(b, err)
	dpool, err := testbed.NewDecode(dec, g)
	require.NoError(b, err)
	obs := &landedObserver{want: 3, n: map[uint64]int{}, done: make(chan uint64, 1)} // 2 groups of 4 + the hookless layer
	eng, err := system.New(system.Config{Buffers: pool.EngineBuffers(), HookLayers: 8, GroupSize: 4, PageSize: 16},
		system.WithStream(lyingStream{}), system.WithTransport(pre), system.WithLogger(zap.NewNop()), system.WithObserver(obs))
	require.NoError(b, err)
	b.Cleanup(func() { _ = eng.Close(); _ = pre.Close(); _ = dec.Close(); _ = pool.Free(); _ = dpool.Free() })
	require.NoError(b, eng.AddPeer(dpool.Peer("d")))
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// ns/op is the whole register-forward-finish loop; the latencies
		// reported are Finish's alone. (Stop/StartTimer would stop the world
		// around every Finish and disturb exactly what is measured.)
		room := uint64(i + 1)
		_, err := eng.Register(ctx, system.ChunkSpec{Room: room, End: 16, Last: true, SrcPages: []int{i % 8}, TotalPages: 1,
			Infos: []system.DecodeInfo{{Peer: "d", DstPages: []int{i % 8}}}})
		require.NoError(b, err)
		fw, err := eng.BeginForward()
		require.NoError(b, err)
		for l := 0; l < 8; l++ {
			require.NoError(b, fw.LayerEnd(l))
		}
		require.NoError(b, fw.End())
		require.Equal(b, room, <-obs.done)
		start := time.Now()
		res, err := eng.Finish(ctx, room)
		lat = append(lat, time.Since(start))
		if err != nil || res.Status != system.Succeeded {
			b.Fatal(err, res.Status)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds())/1e3, "p99-µs")
}
