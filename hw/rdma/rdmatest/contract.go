package rdmatest

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Factory builds the transports under test.
type Factory struct {
	// Pair returns a sending and a receiving transport that can reach each
	// other. The suite closes them.
	Pair func(t *testing.T) (from, to rdma.Transport)
	// SlowPair, if set, returns a pair whose batches take at least 50 ms to
	// land, so that teardown can be tested with writes in flight.
	SlowPair func(t *testing.T) (from, to rdma.Transport)
	// DirectPeerWrites says that the sender of Pair may write the target's
	// memory itself (shared memory it mapped, cross-memory attach): a
	// PeerAccess's Revoke cannot confirm that such writes stopped, and
	// must answer rdma.ErrNotQuiesced.
	DirectPeerWrites bool

	pool pool // set by Run for each half of the suite
}

// Run runs the contract suite: the writes and the peer access points
// (rdma.PeerAccessor) over memory the caller registered (hostmem) and, on
// transports that allocate (rdma.Allocator), over memory they allocated.
func Run(t *testing.T, f Factory) {
	for _, p := range []pool{registered, allocated} {
		t.Run(p.String(), func(t *testing.T) {
			f := f
			f.pool = p
			t.Run("WritesLandBeforeCompletion", func(t *testing.T) { writesLand(t, f) })
			t.Run("InvalidWritesAreRejected", func(t *testing.T) { invalidWrites(t, f) })
			if f.SlowPair != nil {
				t.Run("CloseLandsNothingMore", func(t *testing.T) { closeLandsNothing(t, f) })
			}
			t.Run("PeerAccess", func(t *testing.T) {
				t.Run("WritesLand", func(t *testing.T) { accessPointsLand(t, f) })
				t.Run("RevokeCutsThePeer", func(t *testing.T) { revokeCutsThePeer(t, f) })
				t.Run("RevokeWithBatchesInFlight", func(t *testing.T) { revokeInFlight(t, f) })
				t.Run("RevokeLostCutsThePeer", func(t *testing.T) { revokeLostCutsThePeer(t, f) })
			})
		})
	}
	t.Run("ConnectUnknownPeerFails", func(t *testing.T) { unknownPeer(t, f) })
	t.Run("Allocation", func(t *testing.T) { allocation(t, f) })
}

// pool is where a test's memory comes from.
type pool int

const (
	registered pool = iota // hostmem, Register
	allocated              // rdma.Allocator
)

func (p pool) String() string {
	if p == allocated {
		return "Allocated"
	}
	return "Registered"
}

// memory is a side's bytes and their address.
type memory struct {
	Addr  uint64
	Bytes []byte
}

type side struct {
	mem *memory
	reg rdma.Region
}

// newSide gives tr n bytes of memory from the pool, registered; the test's
// cleanup releases it (after the transports closed, cleanups running last
// first).
func newSide(t *testing.T, p pool, tr rdma.Transport, n int) side {
	t.Helper()
	if p == allocated {
		al, ok := tr.(rdma.Allocator)
		if !ok {
			t.Skipf("%s does not allocate memory", tr.Name())
		}
		a, err := al.Allocate(uint64(n))
		if errors.Is(err, rdma.ErrUnsupported) {
			t.Skipf("%s: %v", tr.Name(), err)
		}
		require.NoError(t, err)
		t.Cleanup(func() { _ = a.Free() })
		require.Len(t, a.Bytes(), n)
		return side{mem: &memory{Addr: a.Desc().Addr, Bytes: a.Bytes()}, reg: a}
	}
	mem, err := hostmem.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mem.Free() })
	reg, err := tr.Register(mem.Addr, uint64(n))
	require.NoError(t, err)
	return side{mem: &memory{Addr: mem.Addr, Bytes: mem.Bytes}, reg: reg}
}

func pair(t *testing.T, p pool, mk func(t *testing.T) (rdma.Transport, rdma.Transport), n int) (src, dst side, ep rdma.Endpoint, rk rdma.RemoteKey) {
	t.Helper()
	from, to := mk(t)
	t.Cleanup(func() { _ = from.Close(); _ = to.Close() })
	src, dst = newSide(t, p, from, n), newSide(t, p, to, n)
	ep, err := from.Connect(to.Address())
	require.NoError(t, err)
	rk, err = ep.Import(dst.reg.Desc())
	require.NoError(t, err)
	return src, dst, ep, rk
}

func wait(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("batch never completed")
		return nil
	}
}

func writesLand(t *testing.T, f Factory) {
	const n = 1 << 20
	src, dst, ep, rk := pair(t, f.pool, f.Pair, n)
	for i := range src.mem.Bytes {
		src.mem.Bytes[i] = byte(i*7 + 3)
	}
	// Scattered blocks, including a zero-offset and an end-of-region one.
	blocks := [][3]uint64{{0, 4096, 100}, {8192, 0, 4096}, {n - 512, n - 512, 512}, {65536, 131072, 65536}}
	ws := make([]rdma.Write, len(blocks))
	for i, b := range blocks {
		ws[i] = rdma.Write{Src: src.mem.Addr + b[0], Dst: dst.mem.Addr + b[1], Len: b[2], Local: src.reg.Key(), Remote: rk}
	}
	done := make(chan error, 1)
	require.NoError(t, ep.Post(ws, func(err error) { done <- err }))
	require.NoError(t, wait(t, done))
	for _, b := range blocks {
		assert.True(t, bytes.Equal(src.mem.Bytes[b[0]:b[0]+b[2]], dst.mem.Bytes[b[1]:b[1]+b[2]]), "block %v", b)
	}
	// Untouched destination bytes stay zero.
	assert.Equal(t, byte(0), dst.mem.Bytes[4096+100])

	// Many batches in flight at once all complete.
	const batches = 64
	all := make(chan error, batches)
	for i := 0; i < batches; i++ {
		w := rdma.Write{Src: src.mem.Addr + uint64(i)*1024, Dst: dst.mem.Addr + uint64(i)*1024, Len: 1024, Local: src.reg.Key(), Remote: rk}
		require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) { all <- err }))
	}
	for i := 0; i < batches; i++ {
		require.NoError(t, wait(t, all))
	}
	assert.True(t, bytes.Equal(src.mem.Bytes[:batches*1024], dst.mem.Bytes[:batches*1024]))
	require.NoError(t, ep.Close())
}

func invalidWrites(t *testing.T, f Factory) {
	const n = 1 << 16
	src, dst, ep, rk := pair(t, f.pool, f.Pair, n)
	for _, tc := range []struct {
		name string
		w    rdma.Write
	}{
		{"destination past the region", rdma.Write{Src: src.mem.Addr, Dst: dst.mem.Addr + n - 8, Len: 16, Local: src.reg.Key(), Remote: rk}},
		{"source past the region", rdma.Write{Src: src.mem.Addr + n - 8, Dst: dst.mem.Addr, Len: 16, Local: src.reg.Key(), Remote: rk}},
		{"unknown remote key", rdma.Write{Src: src.mem.Addr, Dst: dst.mem.Addr, Len: 16, Local: src.reg.Key(), Remote: rk + 7}},
	} {
		called := make(chan error, 1)
		err := ep.Post([]rdma.Write{tc.w}, func(err error) { called <- err })
		require.Error(t, err, tc.name)
		assert.True(t, errors.Is(err, rdma.ErrInvalidWrite), "%s: %v", tc.name, err)
		select {
		case <-called:
			t.Fatalf("%s: done called after a failed Post", tc.name)
		case <-time.After(10 * time.Millisecond):
		}
	}
	assert.Equal(t, make([]byte, n), dst.mem.Bytes, "nothing landed")
}

func unknownPeer(t *testing.T, f Factory) {
	from, to := f.Pair(t)
	t.Cleanup(func() { _ = from.Close(); _ = to.Close() })
	src := newSide(t, registered, from, 4096)
	dst := newSide(t, registered, to, 4096)
	desc := dst.reg.Desc()
	addr := append([]byte(nil), to.Address()...)
	require.NoError(t, to.Close())

	// The peer is gone: connecting, importing its key or the first batch
	// must fail (transports that connect lazily fail at the batch).
	ep, err := from.Connect(addr)
	if err == nil {
		var rk rdma.RemoteKey
		if rk, err = ep.Import(desc); err == nil {
			done := make(chan error, 1)
			if err = ep.Post([]rdma.Write{{Src: src.mem.Addr, Dst: desc.Addr, Len: 8, Local: src.reg.Key(), Remote: rk}}, func(err error) { done <- err }); err == nil {
				err = wait(t, done)
			}
		}
		_ = ep.Close()
	}
	require.Error(t, err, "writing to a closed peer must fail")
}

func closeLandsNothing(t *testing.T, f Factory) {
	const n = 1 << 16
	src, dst, ep, rk := pair(t, f.pool, f.SlowPair, n)
	for i := range src.mem.Bytes {
		src.mem.Bytes[i] = 0xAB
	}
	var calls atomic.Int32
	done := make(chan error, 2)
	require.NoError(t, ep.Post([]rdma.Write{{Src: src.mem.Addr, Dst: dst.mem.Addr, Len: n, Local: src.reg.Key(), Remote: rk}},
		func(err error) { calls.Add(1); done <- err }))
	closeErr := ep.Close()
	require.False(t, errors.Is(closeErr, rdma.ErrNotQuiesced), "a healthy peer quiesces: %v", closeErr)
	closedAt := append([]byte(nil), dst.mem.Bytes...)
	err := wait(t, done)
	// A transport may drain the batch while closing (then every byte
	// landed) or cut it (then it fails, marked): nothing in between.
	if err == nil {
		assert.Equal(t, bytes.Repeat([]byte{0xAB}, n), closedAt, "a batch reported complete landed whole")
	} else {
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	}
	time.Sleep(100 * time.Millisecond) // past the modeled landing time
	assert.Equal(t, closedAt, dst.mem.Bytes, "bytes changed after Close returned")
	assert.Equal(t, int32(1), calls.Load(), "done runs exactly once")

	err = ep.Post([]rdma.Write{{Src: src.mem.Addr, Dst: dst.mem.Addr, Len: 8, Local: src.reg.Key(), Remote: rk}}, func(error) {})
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken))
}

// allocation checks rdma.Allocator itself: bad sizes are refused, the
// memory is zeroed and is what Desc describes, a freed allocation is no
// write source any more, and a second Free does nothing.
func allocation(t *testing.T, f Factory) {
	from, to := f.Pair(t)
	t.Cleanup(func() { _ = from.Close(); _ = to.Close() })
	al, ok := from.(rdma.Allocator)
	if !ok {
		t.Skipf("%s does not allocate memory", from.Name())
	}
	_, err := al.Allocate(0)
	if errors.Is(err, rdma.ErrUnsupported) {
		t.Skipf("%s: %v", from.Name(), err)
	}
	require.Error(t, err, "zero bytes")
	assert.True(t, errors.Is(err, rdma.ErrInvalidWrite), "%v", err)

	const n = 3*4096 + 100 // not a whole number of pages
	a, err := al.Allocate(n)
	require.NoError(t, err)
	require.Len(t, a.Bytes(), n)
	assert.Equal(t, make([]byte, n), a.Bytes(), "allocated memory is zeroed")
	d := a.Desc()
	assert.Equal(t, uint64(n), d.Len)
	assert.NotZero(t, d.Addr)

	dst := newSide(t, registered, to, n)
	ep, err := from.Connect(to.Address())
	require.NoError(t, err)
	defer ep.Close()
	rk, err := ep.Import(dst.reg.Desc())
	require.NoError(t, err)
	for i := range a.Bytes() {
		a.Bytes()[i] = byte(i*3 + 1)
	}
	done := make(chan error, 1)
	w := rdma.Write{Src: d.Addr, Dst: dst.mem.Addr, Len: n, Local: a.Key(), Remote: rk}
	require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) { done <- err }))
	require.NoError(t, wait(t, done))
	assert.True(t, bytes.Equal(a.Bytes(), dst.mem.Bytes), "Desc().Addr is the first byte of Bytes()")

	require.NoError(t, a.Free())
	require.NoError(t, a.Free(), "a second Free does nothing")
	err = ep.Post([]rdma.Write{w}, func(error) { t.Error("done after a refused Post") })
	require.Error(t, err, "a freed allocation is no write source")
	assert.True(t, errors.Is(err, rdma.ErrInvalidWrite), "%v", err)
}
