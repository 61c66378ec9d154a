//go:build ucx

package ucx

import (
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/hw/rdma/rdmatest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFaultWrapperContract runs the contract over UCX wrapped by rdmafault,
// every completion delayed through the wrapper's own bookkeeping.
func TestFaultWrapperContract(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		rdmatest.Run(t, rdmatest.Factory{DirectPeerWrites: directPeerWrites(), Pair: func(t *testing.T) (rdma.Transport, rdma.Transport) {
			a, b := contractPair(t)
			return rdmafault.Wrap(a, func(rdmafault.BatchInfo) rdmafault.Fault {
				return rdmafault.Fault{Kind: rdmafault.DelayCompletion, Delay: time.Millisecond}
			}), b
		}})
	})
}

// TestFaultsOverUCX injects, over a real UCX endpoint, the faults the
// reliability suite injects over the loopback: a post error, a failed
// completion (nothing lands), a lost completion (it lands; Close reports it)
// and a delayed one.
func TestFaultsOverUCX(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		f := newFixture(t, 1<<16)
		fill(f.src.Bytes, 9)
		kinds := map[uint64]rdmafault.Kind{1: rdmafault.PostError, 2: rdmafault.FailCompletion, 3: rdmafault.LoseCompletion, 4: rdmafault.DelayCompletion}
		from := rdmafault.Wrap(f.from, func(b rdmafault.BatchInfo) rdmafault.Fault {
			return rdmafault.Fault{Kind: kinds[b.Seq], Delay: 30 * time.Millisecond}
		})
		ep, err := from.Connect(f.to.Address())
		require.NoError(t, err)
		rk, err := ep.Import(f.dreg.Desc())
		require.NoError(t, err)
		post := func(off uint64) <-chan error {
			ch := make(chan error, 1)
			w := f.write(off, 8)
			w.Remote = rk
			require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) { ch <- err }))
			return ch
		}

		err = ep.Post([]rdma.Write{f.write(0, 8)}, func(error) { t.Error("done after a failed post") })
		require.Error(t, err)
		assert.True(t, errors.Is(err, rdmafault.ErrInjected), "%v", err)

		err = waitErr(t, post(0))
		require.Error(t, err, "failed completion")
		assert.True(t, errors.Is(err, rdmafault.ErrInjected), "%v", err)
		assert.Equal(t, byte(0), f.dst.Bytes[0], "a failed batch lands nothing")

		lost := post(8)
		start := time.Now()
		require.NoError(t, waitErr(t, post(16)), "delayed completion still succeeds")
		assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
		assert.Equal(t, byte(9), f.dst.Bytes[16], "the delayed batch landed")
		select {
		case err := <-lost:
			t.Fatalf("a lost completion was reported: %v", err)
		default:
		}
		require.NoError(t, ep.Close())
		err = waitErr(t, lost)
		require.Error(t, err, "teardown reports the lost batch as failed")
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
		assert.Equal(t, byte(9), f.dst.Bytes[8], "the lost-completion batch landed")
	})
}
