//go:build ucx

package ucx

import (
	"bytes"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/require"
)

// TestForgedKeyRefused: a peer given one region's key cannot write another
// region of the same transport by naming its slot and generation (small
// counters, the whole key before the secret): decode servers that share a
// transport (decode TP in one process) each offer their own pool to their
// own sessions, and a session's peer wrote the other servers' pools with a
// key it made itself. The write is refused, its batch fails, and the
// region's bytes stay as they were.
func TestForgedKeyRefused(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const n = 4096
	from, err := New(Options{Name: "prefill"})
	require.NoError(t, err)
	to, err := New(Options{Name: "decode"})
	require.NoError(t, err)
	src, err := hostmem.Alloc(n)
	require.NoError(t, err)
	offered, err := hostmem.Alloc(n)
	require.NoError(t, err)
	other, err := hostmem.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = from.Close(); _ = to.Close(); _ = src.Free(); _ = offered.Free(); _ = other.Free() })
	for i := range src.Bytes {
		src.Bytes[i] = 0xab
	}
	sreg, err := from.Register(src.Addr, n)
	require.NoError(t, err)
	oreg, err := to.Register(offered.Addr, n)
	require.NoError(t, err)
	xreg, err := to.Register(other.Addr, n) // never offered to this peer
	require.NoError(t, err)
	a, err := to.OpenPeerAccess()
	require.NoError(t, err)

	post := func(ep rdma.Endpoint, dst uint64, rk rdma.RemoteKey) error {
		done := make(chan error, 1)
		require.NoError(t, ep.Post([]rdma.Write{{Src: src.Addr, Dst: dst, Len: n, Local: sreg.Key(), Remote: rk}}, func(err error) { done <- err }))
		return waitErr(t, done)
	}
	// The offered region: the connection is warm and sound.
	ep, err := from.Connect(a.Address())
	require.NoError(t, err)
	rk, err := ep.Import(oreg.Desc())
	require.NoError(t, err)
	require.NoError(t, post(ep, offered.Addr, rk))
	require.True(t, bytes.Equal(src.Bytes[:n], offered.Bytes[:n]))

	// The other region's key as the peer makes it: the offered key with the
	// other region's slot and generation.
	oslot, _, osecret, ok := parseMessageKey(oreg.Desc().Key)
	require.True(t, ok)
	xslot, xgen, xsecret, ok := parseMessageKey(xreg.Desc().Key)
	require.True(t, ok)
	require.NotEqual(t, oslot, xslot)
	require.NotEqual(t, osecret, xsecret, "two regions drew one secret")
	forged := messageKey(xslot, xgen, osecret)
	ep2, err := from.Connect(a.Address())
	require.NoError(t, err)
	frk, err := ep2.Import(rdma.RegionDesc{Addr: other.Addr, Len: n, Key: forged})
	require.NoError(t, err)
	err = post(ep2, other.Addr, frk)
	require.Error(t, err, "a write with a forged key reported success")
	require.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	require.Equal(t, make([]byte, n), other.Bytes[:n], "a write with a forged key landed")
}
