package system_test

import (
	"context"
	"errors" // the standard library's, on purpose: what a caller without cockroachdb has
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// stdEngine is an engine of 2 MLA buffers (2 hook layers, K = 2) with a
// decode peer "d", on a virtual GPU whose events misbehave as fault says.
func stdEngine(t *testing.T, fault sim.Fault, timeout time.Duration, opts ...system.Option) *system.Engine {
	t.Helper()
	const itemLen, pages = 64, 8
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("p")
	require.NoError(t, err)
	dec, err := fab.NewTransport("d")
	require.NoError(t, err)
	src, err := hostmem.Alloc(2 * itemLen * pages)
	require.NoError(t, err)
	dst, err := hostmem.Alloc(2 * itemLen * pages)
	require.NoError(t, err)
	gpu := sim.New(sim.Options{Faults: func(sim.EventInfo) sim.Fault { return fault }})
	t.Cleanup(func() { gpu.Close(); _ = pre.Close(); _ = dec.Close(); _ = src.Free(); _ = dst.Free() })
	e, err := system.New(system.Config{
		Buffers:    system.MLABuffers([]uint64{src.Addr, src.Addr + itemLen*pages}, itemLen, pages),
		HookLayers: 2, GroupSize: 2, PageSize: 4, FinishTimeout: timeout,
	}, append([]system.Option{system.WithStream(gpu.NewStream("compute")), system.WithTransport(pre), system.WithLogger(zap.NewNop()),
		system.WithGetenv(func(string) string { return "" })}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	peer := system.Peer{ID: "d", Address: dec.Address()}
	for _, base := range []uint64{dst.Addr, dst.Addr + itemLen*pages} {
		r, err := dec.Register(base, itemLen*pages)
		require.NoError(t, err)
		peer.Buffers = append(peer.Buffers, system.PeerBuffer{Region: r.Desc(), ItemLen: itemLen})
	}
	require.NoError(t, e.AddPeer(peer))
	return e
}

func stdSpec(room uint64) system.ChunkSpec {
	return system.ChunkSpec{Room: room, Start: 0, End: 8, Last: true, SrcPages: []int{0, 1}, TotalPages: 2,
		Infos: []system.DecodeInfo{{Peer: "d", DstPages: []int{2, 3}}}}
}

// forward registers room 1 and runs one forward over it.
func forward(t *testing.T, e *system.Engine) {
	t.Helper()
	_, err := e.Register(context.Background(), stdSpec(1))
	require.NoError(t, err)
	fw, err := e.BeginForward()
	require.NoError(t, err)
	require.NoError(t, fw.LayerEnd(0))
	_ = fw.LayerEnd(1) // the boundary: its event may fail to record, by design of the fault
	_ = fw.End()
}

// TestStandardErrorsIs checks, with only the standard library's errors
// package, that the classes of errors the engine returns are visible to
// errors.Is: wherever cockroachdb's errors.Is sees a mark, so does the
// standard library's.
func TestStandardErrorsIs(t *testing.T) {
	t.Run("bad input", func(t *testing.T) {
		e := stdEngine(t, sim.NoFault, time.Second)
		spec := stdSpec(1)
		spec.SrcPages = []int{0, 99}
		_, err := e.Register(context.Background(), spec)
		assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
		fw, err := e.BeginForward()
		require.NoError(t, err)
		assert.True(t, errors.Is(fw.LayerEnd(7), system.ErrBadInput))
		require.NoError(t, fw.End())
		assert.True(t, errors.Is(fw.End(), system.ErrBadInput), "End twice")
		assert.True(t, errors.Is(e.AddPeer(system.Peer{}), system.ErrBadInput))
		_, err = e.Finish(context.Background(), 42)
		assert.True(t, errors.Is(err, system.ErrBadInput), "unknown room: %v", err)
		assert.True(t, errors.Is(e.Drop(context.Background(), 42), system.ErrBadInput), "unknown room")
		_, err = system.New(system.Config{})
		assert.True(t, errors.Is(err, system.ErrBadInput), "New: %v", err)
	})
	t.Run("closed", func(t *testing.T) {
		e := stdEngine(t, sim.NoFault, time.Second)
		require.NoError(t, e.Close())
		_, err := e.Register(context.Background(), stdSpec(1))
		assert.True(t, errors.Is(err, system.ErrClosed))
		assert.True(t, errors.Is(err, system.ErrBadInput))
		_, err = e.BeginForward()
		assert.True(t, errors.Is(err, system.ErrClosed))
		_, err = e.Finish(context.Background(), 1)
		assert.True(t, errors.Is(err, system.ErrClosed))
		assert.True(t, errors.Is(e.Drop(context.Background(), 1), system.ErrClosed))
		assert.True(t, errors.Is(e.AddPeer(system.Peer{}), system.ErrClosed))
	})
	t.Run("peer lost", func(t *testing.T) {
		e := stdEngine(t, sim.NoFault, time.Second)
		require.NoError(t, e.PeerLost("d", errors.New("its process died")))
		_, err := e.Register(context.Background(), stdSpec(1))
		assert.True(t, errors.Is(err, system.ErrPeerLost), "%v", err)
		assert.True(t, errors.Is(err, system.ErrEndpointBroken), "%v", err)
	})
	t.Run("timeout", func(t *testing.T) {
		e := stdEngine(t, sim.NeverComplete, 200*time.Millisecond)
		forward(t, e)
		res, err := e.Finish(context.Background(), 1)
		assert.True(t, errors.Is(err, system.ErrTimeout), "%v", err)
		assert.True(t, errors.Is(res.Err, system.ErrTimeout), "Result.Err too")
	})
	t.Run("event wait", func(t *testing.T) {
		e := stdEngine(t, sim.WaitError, time.Second)
		forward(t, e)
		_, err := e.Finish(context.Background(), 1)
		assert.True(t, errors.Is(err, system.ErrEventWait), "%v", err)
	})
	t.Run("success is nil", func(t *testing.T) {
		e := stdEngine(t, sim.NoFault, time.Second)
		forward(t, e)
		res, err := e.Finish(context.Background(), 1)
		require.NoError(t, err)
		assert.Equal(t, system.Succeeded, res.Status)
		assert.NoError(t, res.Err)
	})
}
