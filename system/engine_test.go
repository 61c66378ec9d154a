package system

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	itemLen = 32
	pages   = 16
)

// enginePools is the fabric the engine tests run on: the prefill's
// transport and 4 MLA buffers of 16 pages in its host memory, and the
// decode peer "d" of as many pages, its regions registered.
type enginePools struct {
	fab     *loopback.Fabric
	pre     *loopback.Transport
	buffers []Buffer
	peer    Peer
	dst     []uint64 // the decode buffers' bases in host memory
}

func newEnginePools(t testing.TB) enginePools {
	t.Helper()
	fab := loopback.NewFabric(loopback.Options{})
	pre, err := fab.NewTransport("p")
	require.NoError(t, err)
	dec, err := fab.NewTransport("d")
	require.NoError(t, err)
	src, err := hostmem.Alloc(4 * itemLen * pages)
	require.NoError(t, err)
	dst, err := hostmem.Alloc(4 * itemLen * pages)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pre.Close(); _ = dec.Close(); _ = src.Free(); _ = dst.Free() })
	bases := func(b *hostmem.Block) []uint64 {
		out := make([]uint64, 4)
		for i := range out {
			out[i] = b.Addr + uint64(i*itemLen*pages)
		}
		return out
	}
	peer := Peer{ID: "d", Address: dec.Address()}
	for _, base := range bases(dst) {
		r, err := dec.Register(base, itemLen*pages)
		require.NoError(t, err)
		peer.Buffers = append(peer.Buffers, PeerBuffer{Region: r.Desc(), ItemLen: itemLen})
	}
	return enginePools{fab: fab, pre: pre, buffers: MLABuffers(bases(src), itemLen, pages), peer: peer, dst: bases(dst)}
}

// newEngine returns an engine over 4 MLA buffers (3 hook layers) and a
// decode peer "d" with 16 pages, on a private fabric.
func newEngine(t testing.TB, env map[string]string) *Engine {
	t.Helper()
	p := newEnginePools(t)
	e, err := New(Config{Buffers: p.buffers, HookLayers: 3, PageSize: 4},
		WithTransport(p.pre), withSimulated(), WithLogger(zap.NewNop()), WithGetenv(func(k string) string { return env[k] }))
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	require.NoError(t, e.AddPeer(p.peer))
	return e
}

func goodSpec() ChunkSpec {
	return ChunkSpec{Room: 1, Start: 0, End: 16, Last: true, SrcPages: []int{0, 1, 2, 3}, TotalPages: 4,
		Infos: []DecodeInfo{{Peer: "d", DstPages: []int{4, 5, 6, 7}}}}
}

func TestRegisterBadInput(t *testing.T) {
	e := newEngine(t, nil)
	for _, tc := range []struct {
		name string
		mod  func(*ChunkSpec)
		want string
	}{
		{"unaligned start", func(s *ChunkSpec) { s.Start = 3 }, "chunk start 3: not aligned to page size 4"},
		{"pages disagree with the range", func(s *ChunkSpec) { s.SrcPages = []int{0, 1} }, "room 1 chunk [0, 16): 2 source pages, the range needs 4"},
		{"negative page", func(s *ChunkSpec) { s.SrcPages[2] = -1 }, "source page -1 at index 2: outside the pool of 16 pages"},
		{"duplicate page", func(s *ChunkSpec) { s.SrcPages[3] = 1 }, "source page 1 at index 3: duplicate"},
		{"page beyond the pool", func(s *ChunkSpec) { s.SrcPages[0] = 16 }, "source page 16 at index 0: outside the pool"},
		{"unknown peer", func(s *ChunkSpec) { s.Infos[0].Peer = "nobody" }, `room 1 info 0: unknown peer "nobody"`},
		{"destination beyond the decode pool", func(s *ChunkSpec) { s.Infos[0].DstPages[1] = 99 }, "destination page 99 at index 1: outside the pool of 16 pages"},
		{"destination list too short", func(s *ChunkSpec) { s.Infos[0].DstPages = []int{4, 5}; s.TotalPages = 0 }, "position 2 (and 1 more) beyond the destination page list of 2 pages"},
		{"no decode info", func(s *ChunkSpec) { s.Infos = nil }, "room 1: no decode info"},
		{"chunk beyond the request", func(s *ChunkSpec) { s.TotalPages = 3 }, "chunk pages [0, 4) beyond the request's 3 pages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := goodSpec()
			tc.mod(&s)
			_, err := e.Register(context.Background(), s)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
			assert.False(t, e.HasRoom(1), "a rejected registration changes no state")
		})
	}
	reg, err := e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	assert.Equal(t, PerLayer, reg.Mode)
	assert.True(t, e.HasRoom(1))
}

func TestForwardBadInput(t *testing.T) {
	e := newEngine(t, nil)
	_, err := e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	fw, err := e.BeginForward()
	require.NoError(t, err)
	for _, l := range []int{-1, 3, 1 << 20} {
		err := fw.LayerEnd(l)
		require.Error(t, err)
		assert.True(t, errors.Is(err, ErrBadInput))
		assert.Contains(t, err.Error(), "outside the 3 hook layers")
	}
	require.NoError(t, fw.LayerEnd(2))
	require.NoError(t, fw.End())
	assert.ErrorContains(t, fw.End(), "End called twice")
	assert.ErrorContains(t, fw.LayerEnd(0), "LayerEnd(0) after End")
	res, err := e.Finish(context.Background(), 1)
	require.NoError(t, err)
	assert.Equal(t, Succeeded, res.Status)
}

func TestUnknownRoomsAndCallsAfterClose(t *testing.T) {
	e := newEngine(t, nil)
	_, err := e.Finish(context.Background(), 42)
	assert.True(t, errors.Is(err, ErrBadInput) && errors.Is(err, ErrNoChunk), "%v", err)
	assert.ErrorContains(t, err, "room 42: no chunk to finish")
	err = e.Drop(context.Background(), 42)
	assert.True(t, errors.Is(err, ErrBadInput) && errors.Is(err, ErrNoChunk), "%v", err)
	assert.ErrorContains(t, err, "room 42: no chunk to drop")

	// A second Finish of a room meets the same error, whether its room
	// actor is still there or already stopped.
	_, err = e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	_, err = e.Finish(context.Background(), 1)
	require.NoError(t, err)
	_, err = e.Finish(context.Background(), 1)
	assert.True(t, errors.Is(err, ErrNoChunk), "%v", err)
	assert.ErrorContains(t, err, "room 1: no chunk to finish")

	_, err = e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	require.NoError(t, e.Close())
	assert.False(t, e.HasRoom(1), "Close drops every room")
	_, err = e.Register(context.Background(), goodSpec())
	assert.True(t, errors.Is(err, ErrClosed) && errors.Is(err, ErrBadInput), "%v", err)
	_, err = e.BeginForward()
	assert.True(t, errors.Is(err, ErrClosed))
	_, err = e.Finish(context.Background(), 1)
	assert.True(t, errors.Is(err, ErrClosed))
	assert.True(t, errors.Is(e.Drop(context.Background(), 1), ErrClosed))
	assert.True(t, errors.Is(e.AddPeer(Peer{}), ErrClosed))
	require.NoError(t, e.Close(), "Close is idempotent")
}

func TestAddPeerValidates(t *testing.T) {
	e := newEngine(t, nil)
	err := e.AddPeer(Peer{ID: "x", Address: []byte("d"), Buffers: make([]PeerBuffer, 3)})
	assert.ErrorContains(t, err, `peer "x" has 3 buffers, the prefill layout 4`)
	bufs := make([]PeerBuffer, 4)
	for i := range bufs {
		bufs[i] = PeerBuffer{ItemLen: itemLen, Region: rdma.RegionDesc{Addr: 0x1000, Len: itemLen * pages, Key: []byte{0, 0, 0, 0}}}
	}
	bufs[2].ItemLen = 64
	err = e.AddPeer(Peer{ID: "x", Address: []byte("d"), Buffers: bufs})
	assert.ErrorContains(t, err, `peer "x" buffer 2: item length 64, prefill 32`)
	bufs[2].ItemLen = itemLen
	require.NoError(t, e.AddPeer(Peer{ID: "x", Address: []byte("d"), Buffers: bufs}))
	assert.ErrorContains(t, e.AddPeer(Peer{ID: "x", Address: []byte("d"), Buffers: bufs}), `peer "x" already added`)
}

func TestConfigDefaultsAndEnvironment(t *testing.T) {
	e := newEngine(t, map[string]string{EnvGroupSize: "4", EnvSubmitters: "2", EnvFinishTimeout: "2.5", EnvPerLayer: "false"})
	c := e.Config()
	assert.Equal(t, 4, c.GroupSize)
	assert.Equal(t, 2, c.Submitters)
	assert.Equal(t, 2500*time.Millisecond, c.FinishTimeout)
	assert.True(t, c.DisablePerLayer)
	reg, err := e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	assert.Equal(t, Monolithic, reg.Mode, "per-layer off: the room goes monolithic")
	assert.Equal(t, cp.PerLayerOff, reg.Reason)

	d, err := Config{HookLayers: 1}.withDefaults(func(string) string { return "" })
	require.NoError(t, err)
	assert.Equal(t, DefaultGroupSize, d.GroupSize)
	assert.Equal(t, DefaultSubmitters, d.Submitters)
	assert.Equal(t, DefaultFinishTimeout, d.FinishTimeout)
	assert.False(t, d.DisablePerLayer)
	assert.Equal(t, 1, d.CP.Size)

	explicit, err := Config{HookLayers: 1, GroupSize: 16}.withDefaults(func(k string) string {
		if k == EnvGroupSize {
			return "3"
		}
		return ""
	})
	require.NoError(t, err)
	assert.Equal(t, 16, explicit.GroupSize, "an explicit field wins over the environment")

	for name, val := range map[string]string{EnvGroupSize: "eight", EnvSubmitters: "0", EnvFinishTimeout: "soon", EnvPerLayer: "maybe"} {
		getenv := func(k string) string {
			if k == name {
				return val
			}
			return ""
		}
		_, err := Config{HookLayers: 1}.withDefaults(getenv)
		require.Error(t, err, name)
		assert.True(t, errors.Is(err, ErrBadInput))
		assert.Contains(t, err.Error(), name+`="`+val+`"`)
		// Malformed is malformed where a field sets the knob too, and
		// CheckEnv (what the commands call at start) says the same.
		_, err = Config{HookLayers: 1, GroupSize: 2, Submitters: 2, FinishTimeout: time.Second, DisablePerLayer: true}.withDefaults(getenv)
		assert.ErrorContains(t, err, name+`="`+val+`"`)
		err = checkEnv(getenv)
		assert.True(t, errors.Is(err, ErrBadInput))
		assert.ErrorContains(t, err, name+`="`+val+`"`)
	}
	require.NoError(t, checkEnv(func(string) string { return "" }))
	_, err = New(Config{HookLayers: 2, PageSize: 4, Buffers: []Buffer{{Name: "KV0", Base: 1, ItemLen: 0, Pages: 4}}}, withSimulated(), WithLogger(zap.NewNop()))
	require.Error(t, err)
	assert.ErrorContains(t, err, "buffer 0 (KV0): item length 0")
	t.Setenv(EnvFinishTimeout, "-5")
	assert.ErrorContains(t, CheckEnv(), EnvFinishTimeout+`="-5": want a positive duration`)
}

// A finish timeout in seconds beyond a Duration (1e10 s, Inf) or under a
// nanosecond used to pass CheckEnv and convert to a negative or zero
// timeout, which New then refused without naming the variable; negative
// restart bounds were taken as they were, and MaxRestarts -1 made every
// registration fail as a restart storm. Each is refused naming the value.
func TestConfigRefusesOutOfRange(t *testing.T) {
	// 9223372035 s is below time.Duration's range, but a call waits for
	// its timeout plus finishGrace, which would overflow; so is a Go
	// duration that large.
	for _, val := range []string{"1e10", "Inf", "1e-12", "9223372035", "2562047h47m16s"} {
		getenv := func(k string) string {
			if k == EnvFinishTimeout {
				return val
			}
			return ""
		}
		err := checkEnv(getenv)
		require.Error(t, err, val)
		assert.True(t, errors.Is(err, ErrBadInput))
		assert.ErrorContains(t, err, EnvFinishTimeout+`="`+val+`"`)
		_, err = Config{HookLayers: 1}.withDefaults(getenv)
		assert.ErrorContains(t, err, EnvFinishTimeout+`="`+val+`"`)
	}
	_, err := Config{HookLayers: 1, FinishTimeout: maxDuration + 1}.withDefaults(func(string) string { return "" })
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "finish timeout")
	d, err := envDuration(func(string) string { return "9223372030" }, EnvFinishTimeout, DefaultFinishTimeout)
	require.NoError(t, err)
	assert.Positive(t, d+finishGrace, "the longest timeout accepted leaves room for the grace")
	_, err = Config{HookLayers: 1, MaxRestarts: -1}.withDefaults(func(string) string { return "" })
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "max restarts -1")
	_, err = Config{HookLayers: 1, RestartWindow: -time.Second}.withDefaults(func(string) string { return "" })
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "restart window -1s")
}

// KVSTREAM_TRACE=path turns recording on without a code change: the trace
// is written when the engine closes, and DumpTrace works meanwhile.
func TestTraceFromEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	e := newEngine(t, map[string]string{EnvTrace: path})
	_, err := e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	var now bytes.Buffer
	require.NoError(t, e.DumpTrace(&now))
	assert.Contains(t, now.String(), `"type":"RegisterCall"`)
	require.NoError(t, e.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	tr, err := trace.Read(bytes.NewReader(raw))
	require.NoError(t, err)
	assert.Equal(t, 3, tr.Header.Config.HookLayers)
	var types []string
	for _, r := range tr.Records {
		types = append(types, r.Actor+"/"+r.Type)
	}
	assert.Contains(t, types, "engine/AddPeerCall")
	assert.Contains(t, types, "manager/AddChunk")
	assert.Contains(t, types, "chunk/Drop", "Close dropped the room")

	off := newEngine(t, nil)
	require.ErrorContains(t, off.DumpTrace(&now), "tracing is off")
	_, err = New(Config{HookLayers: 1, PageSize: 1, Buffers: MLABuffers([]uint64{1}, 8, 1)}, withSimulated(),
		WithGetenv(func(k string) string {
			if k == EnvTrace {
				return "/nonexistent/dir/trace"
			}
			return ""
		}), WithLogger(zap.NewNop()))
	require.ErrorContains(t, err, `KVSTREAM_TRACE="/nonexistent/dir/trace"`)
}

// TestRegisterCancelledChangesNothing: an error from Register means nothing
// was registered, so no later forward sends anything for it.
func TestRegisterCancelledChangesNothing(t *testing.T) {
	e := newEngine(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.Register(ctx, goodSpec())
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)
	assert.False(t, e.HasRoom(1), "a cancelled registration left a chunk behind")
	fw, err := e.BeginForward()
	require.NoError(t, err)
	for l := 0; l < 3; l++ {
		require.NoError(t, fw.LayerEnd(l))
	}
	require.NoError(t, fw.End())
	_, err = e.Finish(context.Background(), 1)
	assert.True(t, errors.Is(err, ErrBadInput), "nothing to finish: %v", err)

	// The same chunk with a live context registers normally.
	reg, err := e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	assert.False(t, reg.Existing)
}

// TestReRegisterWithOtherPagesIsRefused: registering an active chunk again
// with different pages used to keep the old pages silently.
func TestReRegisterWithOtherPagesIsRefused(t *testing.T) {
	e := newEngine(t, nil)
	first, err := e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		mod  func(*ChunkSpec)
		want string
	}{
		{"source page", func(s *ChunkSpec) { s.SrcPages[2] = 9 }, "source pages: page 9 at index 2, first registered as 2"},
		{"destination page", func(s *ChunkSpec) { s.Infos[0].DstPages[0] = 12 }, "info 0 destination pages: page 12 at index 0, first registered as 4"},
		{"destination count", func(s *ChunkSpec) { s.Infos = append(s.Infos, DecodeInfo{Peer: "d", Dummy: true}) }, "2 decode infos, first registered with 1"},
		{"total pages", func(s *ChunkSpec) { s.TotalPages = 8 }, "8 total pages, first registered with 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := goodSpec()
			tc.mod(&s)
			_, err := e.Register(context.Background(), s)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), "room 1 chunk [0, 16): registered again with "+tc.want)
		})
	}
	again, err := e.Register(context.Background(), goodSpec())
	require.NoError(t, err, "the same pages again are a cheap no-op")
	assert.True(t, again.Existing)
	assert.Equal(t, first.Chunk, again.Chunk)

	// The engine keeps its own copy: a caller reusing its slices changes
	// nothing of the registration.
	s := goodSpec()
	_, err = e.Register(context.Background(), ChunkSpec{Room: 2, End: 16, Last: true, SrcPages: s.SrcPages, TotalPages: 4,
		Infos: []DecodeInfo{{Peer: "d", DstPages: s.Infos[0].DstPages}}})
	require.NoError(t, err)
	s.SrcPages[0] = 15
	_, err = e.Register(context.Background(), ChunkSpec{Room: 2, End: 16, Last: true, SrcPages: s.SrcPages, TotalPages: 4,
		Infos: []DecodeInfo{{Peer: "d", DstPages: s.Infos[0].DstPages}}})
	assert.ErrorContains(t, err, "source pages: page 15 at index 0, first registered as 0")
}

// TestNoSilentSimulatedHardware: an engine without a stream or a transport
// used to run quietly on a virtual GPU and in-process memory, moving
// nothing anywhere. Simulated hardware is now an explicit choice.
func TestNoSilentSimulatedHardware(t *testing.T) {
	mem, err := hostmem.Alloc(8)
	require.NoError(t, err)
	defer mem.Free()
	cfg := Config{HookLayers: 1, PageSize: 1, Buffers: MLABuffers([]uint64{mem.Addr}, 8, 1)}
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("p")
	require.NoError(t, err)
	defer tr.Close()
	_, err = New(cfg, WithTransport(tr), WithLogger(zap.NewNop()))
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "no compute stream: pass WithStream or WithGPU (or WithHardware(simulated.Hardware()) for a virtual GPU)")
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	_, err = New(cfg, WithStream(gpu.NewStream("s")), WithLogger(zap.NewNop()))
	assert.ErrorContains(t, err, "no transport: pass WithTransport (or WithHardware(simulated.Hardware()) for the in-process loopback fabric)")

	e, err := New(cfg, withSimulated(), WithLogger(zap.NewNop()))
	require.NoError(t, err)
	assert.NotNil(t, e.Stream())
	assert.NotNil(t, e.Transport())
	require.NoError(t, e.Close())
}
