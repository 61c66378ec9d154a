//go:build ucx

package ucx

import (
	"testing"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRendezvousMessagesRefused: a peer sends its message writes and
// FLUSHes by UCX's rendezvous protocol (kvstream's own send eager). UCX
// hands each handler a rendezvous descriptor, which it drops itself when
// the handler returns UCS_OK: a handler that also released it gave it back
// twice (a second ATS to the sender, the descriptor put twice into UCX's
// pool, the FLUSH's header read after its release). The receiver must
// refuse every such write, land nothing of it, and go on serving a
// legitimate sender.
func TestRendezvousMessagesRefused(t *testing.T) {
	eachFabricIn(t, []WriteMode{WriteMessages}, func(t *testing.T) {
		const n, rounds = 1 << 16, 256
		f := newFixture(t, n)
		fill(f.src.Bytes, 0x5A)
		hostile, err := New(Options{Name: "hostile", Writes: WriteMessages})
		require.NoError(t, err)
		defer hostile.Close()
		hostile.sendByRendezvous()
		src, err := hostile.Register(f.src.Addr, n)
		require.NoError(t, err)
		defer src.Deregister()
		for i := range rounds {
			ep, err := hostile.Connect(f.to.Address())
			require.NoError(t, err)
			rk, err := ep.Import(f.dreg.Desc())
			require.NoError(t, err)
			ch := make(chan error, 1)
			w := rdma.Write{Src: f.src.Addr, Dst: f.dst.Addr, Len: uint64(4096 * (1 + i%16)), Local: src.Key(), Remote: rk}
			require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) { ch <- err }))
			assert.Error(t, waitErr(t, ch), "round %d: a write sent by rendezvous", i)
			_ = ep.Close()
		}
		assert.Equal(t, make([]byte, n), f.dst.Bytes, "nothing of the rendezvous writes landed")

		// The receiver still serves a legitimate sender, many times over
		// (a descriptor given back twice hands the same memory out twice).
		for i := range rounds {
			ch := make(chan error, 1)
			require.NoError(t, f.ep.Post([]rdma.Write{f.write(0, n)}, func(err error) { ch <- err }))
			require.NoError(t, waitErr(t, ch), "legitimate batch %d", i)
		}
		assert.Equal(t, f.src.Bytes, f.dst.Bytes)

		// A receiver that answers FLUSHes by rendezvous: the sender's
		// handler must not give the answer back twice either.
		answers, err := New(Options{Name: "hostile-decode", Writes: WriteMessages})
		require.NoError(t, err)
		defer answers.Close()
		answers.sendByRendezvous()
		dst, err := answers.Register(f.dst.Addr, n)
		require.NoError(t, err)
		defer dst.Deregister()
		for i := range rounds {
			ep, err := f.from.Connect(answers.Address())
			require.NoError(t, err)
			rk, err := ep.Import(dst.Desc())
			require.NoError(t, err)
			ch := make(chan error, 1)
			w := rdma.Write{Src: f.src.Addr, Dst: f.dst.Addr, Len: 4096, Local: f.sreg.Key(), Remote: rk}
			require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) { ch <- err }))
			require.NoError(t, waitErr(t, ch), "round %d: a write answered by rendezvous", i)
			_ = ep.Close()
		}
	})
}
