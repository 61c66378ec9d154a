//go:build ucx

package xferbench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/ucx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ucxFabrics are the UCX_TLS settings the UCX runs use: TCP through the
// loopback interface, and shared memory, as hw/rdma/ucx's own tests do.
var ucxFabrics = []struct{ name, tls string }{{"tcp", "tcp"}, {"shm", "sm,self"}}

// openUCX opens the transports as cmd/kvstream's registry does.
func openUCX(_, name string) (rdma.Transport, error) {
	return ucx.New(ucx.Options{Name: name, CloseDrain: time.Second})
}

// TestUCXDestinationBytes checks, past UCX's flush, the destination
// bytes themselves.
func TestUCXDestinationBytes(t *testing.T) {
	for _, fab := range ucxFabrics {
		for _, pool := range []string{PoolAllocated, PoolRegistered} {
			t.Run(fab.name+"/"+pool, func(t *testing.T) {
				t.Setenv("UCX_TLS", fab.tls)
				const size, count = 3000, 17
				var dst []byte
				rep, err := Run(context.Background(), Config{
					Transport: "ucx", Size: size, Count: count, Slots: count, Window: 3, WritesPerBatch: 2,
					Warmup: -1, Repeat: 1, Timeout: time.Minute, Open: openUCX, Pool: pool,
					inspect: func(_, d []byte) { dst = bytes.Clone(d) },
				})
				require.NoError(t, err)
				want := make([]byte, count*size)
				fillPattern(want)
				assert.Equal(t, want, dst)
				assert.Equal(t, fab.tls, rep.UCXTLS)
				assert.Equal(t, pool, rep.Pool)
			})
		}
	}
}
