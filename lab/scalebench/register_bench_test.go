package scalebench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkRegister100k is bench scale's plan_ms measure at chosen points:
// the registration of a 100k-page chunk (plan.BuildPlan behind the façade,
// and the engine's copy of the spec) toward 1 or 32 destinations, each its
// own list (a decode TP group's ranks: equal lists, each its own slice),
// or toward 32 sharing one slice (dests32shared: the lists are equal
// without being read), at fragmentation 1 (every decode page its own run)
// and 16. Each chunk is dropped before the next, untimed. ms/op is the
// mean, which a garbage collection cycle now and then weighs on;
// median-ms is bench scale's figure.
func BenchmarkRegister100k(b *testing.B) {
	for _, tc := range []struct {
		name   string
		dests  int
		shared bool
	}{{"dests1", 1, false}, {"dests32", 32, false}, {"dests32shared", 32, true}} {
		for _, frag := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/frag%d", tc.name, frag), func(b *testing.B) {
				r, err := newRig(64, tc.dests, ChunkPages)
				if err != nil {
					b.Fatal(err)
				}
				defer r.close()
				ctx := context.Background()
				src, dsts := seq(ChunkPages), r.perDest(fragmented(ChunkPages, frag))
				if tc.shared {
					dsts = dsts[:1] // r.spec: one list for every destination
				}
				took := make([]time.Duration, 0, b.N)
				var sum time.Duration
				for i := 0; i < b.N; i++ {
					room := uint64(i + 1)
					t0 := time.Now()
					if _, err := r.eng.Register(ctx, r.spec(room, src, dsts)); err != nil {
						b.Fatal(err)
					}
					d := time.Since(t0)
					took, sum = append(took, d), sum+d
					if err := r.eng.Drop(ctx, room); err != nil {
						b.Fatal(err)
					}
				}
				slices.Sort(took)
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(float64(sum.Nanoseconds())/1e6/float64(b.N), "ms/op")
				b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e6, "median-ms")
			})
		}
	}
}
