//go:build ucx

package ucx

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/tally"
	"github.com/stretchr/testify/require"
)

// BenchmarkPut measures the Post path. One op is one put of the given size;
// batches carry `writes` puts each (1: a flush per put, the strictest case;
// 16: the engine's shape, where a group's blocks go as one batch), and up
// to `window` puts are in flight, as ucx_perftest keeps puts in flight.
// Every write of a batch covers the same source and destination range, so
// the memory footprint is ucx_perftest's (one buffer of the message size).
// The regions are allocated by the transports (Allocate, as ucx_perftest's
// default buffers are) or hostmem registered with Register.
//
// Compare with `ucx_perftest -t ucp_put_bw -s <size>` over the same UCX_TLS
// (`kvstream bench transport --perftest` runs both). Over shared memory
// ucx_perftest's default buffers compare with the allocated pool, and
// ucx_perftest with UCX_ALLOC_PRIO=mmap,heap with the registered one.
func BenchmarkPut(b *testing.B) {
	const window = 64
	for _, fab := range fabrics {
		for _, pool := range []string{"allocated", "registered"} {
			for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
				for _, writes := range []int{1, 16} {
					b.Run(fmt.Sprintf("%s/%s/%dKiB/writes=%d", fab.name, pool, size>>10, writes), func(b *testing.B) {
						b.Setenv("UCX_TLS", fab.tls)
						benchPut(b, pool == "allocated", size, writes, window/writes)
					})
				}
			}
		}
	}
}

func benchPut(b *testing.B, allocated bool, size, writes, window int) {
	var ep rdma.Endpoint
	var w rdma.Write
	if allocated {
		from, err := New(Options{Name: "prefill"})
		require.NoError(b, err)
		to, err := New(Options{Name: "decode"})
		require.NoError(b, err)
		b.Cleanup(func() { _ = from.Close(); _ = to.Close() })
		src, err := from.Allocate(uint64(size))
		require.NoError(b, err)
		dst, err := to.Allocate(uint64(size))
		require.NoError(b, err)
		ep, err = from.Connect(to.Address())
		require.NoError(b, err)
		rk, err := ep.Import(dst.Desc())
		require.NoError(b, err)
		w = rdma.Write{Src: src.Desc().Addr, Dst: dst.Desc().Addr, Len: uint64(size), Local: src.Key(), Remote: rk}
	} else {
		f := newFixture(b, size)
		ep, w = f.ep, f.write(0, uint64(size))
	}
	ws := make([]rdma.Write, writes)
	for i := range ws {
		ws[i] = w
	}
	runPuts(b, ep, ws, size, window)
}

// runPuts posts b.N puts of size bytes, len(ws) per batch, with up to
// window batches in flight.
func runPuts(b *testing.B, ep rdma.Endpoint, ws []rdma.Write, size, window int) {
	writes := len(ws)
	// Counted, not sent on a channel: the channel's lock would be the
	// benchmark's cost, not the transport's (package tally).
	done := tally.New()
	cb := done.Done
	ctx := context.Background()
	// Warm up: connection setup and protocol selection.
	for range window {
		require.NoError(b, ep.Post(ws, cb))
	}
	require.NoError(b, done.Wait(ctx, int64(window)))
	require.NoError(b, done.Err())
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	base, posted := done.Count(), int64(0)
	for i := 0; i < b.N; i += writes {
		if posted-(done.Count()-base) >= int64(window) {
			if err := done.Wait(ctx, base+posted-int64(window)+1); err != nil {
				b.Fatal(err)
			}
		}
		n := min(writes, b.N-i)
		if err := ep.Post(ws[:n], cb); err != nil {
			b.Fatal(err)
		}
		posted++
	}
	if err := done.Wait(ctx, base+posted); err != nil {
		b.Fatal(err)
	}
	if err := done.Err(); err != nil {
		b.Fatal(err)
	}
}
