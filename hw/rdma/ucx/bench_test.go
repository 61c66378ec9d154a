//go:build ucx

package ucx

import (
	"fmt"
	"testing"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/require"
)

// BenchmarkPut measures the Post path. One op is one put of the given size;
// batches carry `writes` puts each (1: a flush per put, the strictest case;
// 16: the engine's shape, where a group's blocks go as one batch), and up
// to `window` puts are in flight, as ucx_perftest keeps puts in flight.
// Every write of a batch covers the same source and destination range, so
// the memory footprint is ucx_perftest's (one buffer of the message size).
//
// Compare with `ucx_perftest -t ucp_put_bw -s <size>` over the same UCX_TLS
// (a server and a client process on 127.0.0.1). Mind that ucx_perftest
// allocates its buffers through UCX, which on shared memory makes them
// directly mappable by the peer; memory registered here (hostmem) is not,
// so the comparable baseline there is ucx_perftest with
// UCX_ALLOC_PRIO=mmap,heap. And ucx_perftest flushes once at the end of the
// run, while every batch here completes only after its own flush.
func BenchmarkPut(b *testing.B) {
	const window = 64
	for _, fab := range fabrics {
		for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
			for _, writes := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/%dKiB/writes=%d", fab.name, size>>10, writes), func(b *testing.B) {
					b.Setenv("UCX_TLS", fab.tls)
					benchPut(b, size, writes, window/writes)
				})
			}
		}
	}
}

func benchPut(b *testing.B, size, writes, window int) {
	f := newFixture(b, size)
	ws := make([]rdma.Write, writes)
	for i := range ws {
		ws[i] = f.write(0, uint64(size))
	}
	runPuts(b, f.ep, ws, size, window)
}

// runPuts posts b.N puts of size bytes, len(ws) per batch, with up to
// window batches in flight.
func runPuts(b *testing.B, ep rdma.Endpoint, ws []rdma.Write, size, window int) {
	writes := len(ws)
	done := make(chan error, window)
	cb := func(err error) { done <- err }
	// Warm up: connection setup and protocol selection.
	for range window {
		require.NoError(b, ep.Post(ws, cb))
	}
	for range window {
		require.NoError(b, <-done)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	inflight := 0
	for i := 0; i < b.N; i += writes {
		if inflight == window {
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			inflight--
		}
		n := min(writes, b.N-i)
		if err := ep.Post(ws[:n], cb); err != nil {
			b.Fatal(err)
		}
		inflight++
	}
	for ; inflight > 0; inflight-- {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}
