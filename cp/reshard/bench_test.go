package reshard

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvstream/kvstream/cp"
)

// llama70b is Llama-3-70B's KV geometry: 80 layers, 8 KV heads of 128 bf16.
func llama70b(tp, page int, order Order) Side {
	return Side{Layers: 80, KVHeads: 8, HeadDim: 128, ElemBytes: 2, TP: tp, PageSize: page, Order: order}
}

// dsv3 is DeepSeek-V3's MLA latent: 61 layers, 512 + 64 bf16 per token.
func dsv3(tp, page int) Side {
	return Side{Layers: 61, KVHeads: 1, HeadDim: 576, ElemBytes: 2, MLA: true, TP: tp, PageSize: page}
}

const benchTokens = 100_000

// benchPages returns a request's source pages and one destination page list,
// contiguous (a fresh allocation) or scattered (every page its own run).
func benchPages(pages int, scattered bool) (src, dst []int) {
	src, dst = make([]int, pages), make([]int, pages)
	for i := range src {
		src[i], dst[i] = i+7, i+3
	}
	if scattered {
		r := rand.New(rand.NewPCG(1, 2))
		r.Shuffle(len(dst), func(i, j int) { dst[i], dst[j] = dst[j], dst[i] })
	}
	return src, dst
}

// BenchmarkReshardPlan is the per-pairing plan, computed once per peer.
func BenchmarkReshardPlan(b *testing.B) {
	for _, bc := range []struct {
		name string
		p    Pairing
	}{
		{"llama70b-tp8-to-tp16", Pairing{Prefill: llama70b(8, 64, TokenMajor), Decode: llama70b(16, 64, TokenMajor)}},
		{"llama70b-tp4-to-tp8", Pairing{Prefill: llama70b(4, 64, TokenMajor), Decode: llama70b(8, 64, TokenMajor)}},
		{"llama70b-tp1-to-tp8-mixed-order", Pairing{Prefill: llama70b(1, 64, TokenMajor), Decode: llama70b(8, 64, HeadMajor)}},
		{"dsv3-tp8-to-tp16", Pairing{Prefill: dsv3(8, 64), Decode: dsv3(16, 64)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewPlan(&bc.p, Rank{TP: 3 % bc.p.Prefill.TP}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReshardChunk is everything a 100k-token chunk needs at
// registration with TP 8 -> 16 on llama70b: the pairing's plan, the owned
// pages (CP 1) and, for each decode rank this prefill rank feeds, the
// destination pages and the runs.
func BenchmarkReshardChunk(b *testing.B) {
	for _, page := range []int{64, 16} {
		for _, scattered := range []bool{false, true} {
			b.Run(fmt.Sprintf("page%d/scattered=%v", page, scattered), func(b *testing.B) {
				p := Pairing{Prefill: llama70b(8, page, TokenMajor), Decode: llama70b(16, page, TokenMajor)}
				pages := (benchTokens + page - 1) / page
				src, dstPages := benchPages(pages, scattered)
				c := cp.CP{Size: 1}
				b.ReportAllocs()
				for b.Loop() {
					plan, err := NewPlan(&p, Rank{TP: 3})
					if err != nil {
						b.Fatal(err)
					}
					owned, pos, err := c.Owned(src, 0, pages)
					if err != nil {
						b.Fatal(err)
					}
					for i := range plan.Routes {
						if plan.Routes[i].Empty() {
							continue
						}
						dst, err := cp.DstPages(dstPages, pos)
						if err != nil {
							b.Fatal(err)
						}
						if _, err := cp.Coalesce(owned, dst); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkReshardAppendGroup is the run-time path: one group of 8 layers
// (K and V) of a 100k-token chunk with scattered destination pages, to
// every decode rank the prefill rank feeds, into one reused slice. It must
// not allocate; blocks/op is the batch it builds.
func BenchmarkReshardAppendGroup(b *testing.B) {
	for _, bc := range []struct {
		name string
		p    Pairing
	}{
		{"llama70b-tp8-to-tp16", Pairing{Prefill: llama70b(8, 64, TokenMajor), Decode: llama70b(16, 64, TokenMajor)}},
		{"llama70b-tp4-to-tp8-token-major", Pairing{Prefill: llama70b(4, 64, TokenMajor), Decode: llama70b(8, 64, TokenMajor)}},
		{"llama70b-tp4-to-tp8-head-major", Pairing{Prefill: llama70b(4, 64, HeadMajor), Decode: llama70b(8, 64, HeadMajor)}},
		{"dsv3-tp8-to-tp16", Pairing{Prefill: dsv3(8, 64), Decode: dsv3(16, 64)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			page := bc.p.Prefill.PageSize
			pages := (benchTokens + page - 1) / page
			src, dst := benchPages(pages, true)
			runs, err := cp.Coalesce(src, dst)
			if err != nil {
				b.Fatal(err)
			}
			plan, err := NewPlan(&bc.p, Rank{TP: 1})
			if err != nil {
				b.Fatal(err)
			}
			var routes []*Route
			for i := range plan.Routes {
				if !plan.Routes[i].Empty() {
					routes = append(routes, &plan.Routes[i])
				}
			}
			buffers := 8 * bc.p.Prefill.Kinds()
			most := 0
			for _, r := range routes {
				most = max(most, r.Blocks(runs))
			}
			bs := make([]cp.Block, 0, most) // a submitter's slice after its first batch
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				n = 0
				for _, r := range routes {
					for buf := 0; buf < buffers; buf++ {
						d, ok := r.DstBuffer(buf)
						if !ok {
							b.Fatal("buffer not routed")
						}
						bs = r.AppendBlocks(bs[:0], runs, 1<<30, uint64(d+1)<<32)
						n += len(bs)
					}
				}
			}
			b.ReportMetric(float64(n), "blocks/op")
		})
	}
}
