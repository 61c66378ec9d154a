package system

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// A trace the engine writes reads back, whatever its callers handed it: a
// refused AddPeer is recorded with its error and without the geometry it
// was refused for (a region of 2^62 pages recorded as a page count wrapped
// negative, and the trace was unreadable), and its id only as far as a
// trace can hold one.
func TestRefusedAddPeersLeaveTheTraceReadable(t *testing.T) {
	p := newEnginePools(t)
	e, out := newTracedEngine(t, p)

	huge := clonePeer(p.peer)
	huge.ID = "huge"
	huge.Buffers[1].Region.Len = math.MaxUint64 - math.MaxUint64%itemLen // whole pages, wraps an int
	many := clonePeer(p.peer)
	many.ID = "many"
	for len(many.Buffers) <= trace.MaxBuffers {
		many.Buffers = append(many.Buffers, many.Buffers...)
	}
	// An id a trace cannot hold, on a peer the engine would take: refused
	// while it traces (its trace would be unreadable), taken without.
	odd := clonePeer(p.peer)
	odd.ID = "d\x00" + strings.Repeat("x", trace.MaxNameLen)
	for _, bad := range []Peer{huge, many, odd} {
		err := e.AddPeer(bad)
		require.Error(t, err, "peer %q", bad.ID)
		require.True(t, errors.Is(err, ErrBadInput), "%v", err)
	}
	assert.ErrorContains(t, e.AddPeer(odd), "outside what the engine's trace records (tracing is on): ID")
	untraced, err := New(Config{Buffers: p.buffers, HookLayers: 3, PageSize: 4}, WithTransport(p.pre), withSimulated(), WithLogger(zap.NewNop()))
	require.NoError(t, err)
	require.NoError(t, untraced.AddPeer(odd), "without a trace")
	require.NoError(t, untraced.Close())
	require.NoError(t, e.AddPeer(p.peer))
	require.NoError(t, e.Close())

	tr, err := trace.Read(bytes.NewReader(out.Bytes()))
	require.NoError(t, err, "the engine wrote a trace its reader refuses")
	var calls []*trace.AddPeerCall
	for _, rec := range tr.Records {
		if rec.Type != "AddPeerCall" {
			continue
		}
		c, err := tr.Header.Config.DecodeCall(&rec)
		require.NoError(t, err)
		calls = append(calls, c.(*trace.AddPeerCall))
	}
	require.Len(t, calls, 5)
	for _, c := range calls[:4] {
		assert.NotEmpty(t, c.Err, "a refused AddPeer is recorded as refused")
		assert.Empty(t, c.Pages, "a refused AddPeer's geometry is not recorded")
		assert.Empty(t, c.ItemLen)
	}
	assert.Equal(t, []string{"huge", "many"}, []string{calls[0].ID, calls[1].ID})
	assert.True(t, strings.HasPrefix(calls[2].ID, `"d\x00xxx`), "an id a trace cannot hold is recorded quoted: %q", calls[2].ID)
	assert.LessOrEqual(t, len(calls[2].ID), trace.MaxNameLen)
	assert.Equal(t, wantAddPeerCall(p.peer), *calls[4], "an accepted AddPeer keeps its geometry")
}

// wantAddPeerCall is what a trace records of an accepted AddPeer of p: its
// id, and per buffer its item length and pages.
func wantAddPeerCall(p Peer) trace.AddPeerCall {
	c := trace.AddPeerCall{ID: p.ID}
	for _, b := range p.Buffers {
		c.ItemLen = append(c.ItemLen, b.ItemLen)
		c.Pages = append(c.Pages, int(b.Region.Len/b.ItemLen))
	}
	return c
}

// newTracedEngine is newEngine's engine over p, tracing to out, with no
// peer added.
func newTracedEngine(t *testing.T, p enginePools) (*Engine, *bytes.Buffer) {
	t.Helper()
	out := &bytes.Buffer{}
	e, err := New(Config{Buffers: p.buffers, HookLayers: 3, PageSize: 4},
		WithTransport(p.pre), withSimulated(), WithLogger(zap.NewNop()), WithTrace(out, 0))
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, out
}

func clonePeer(p Peer) Peer {
	p.Buffers = slices.Clone(p.Buffers)
	return p
}

// An engine asked to trace refuses, up front and by name, a configuration
// whose trace header its reader would refuse; without a trace the same
// configuration is the engine's own business.
func TestTraceHeaderOutsideTheReadersBounds(t *testing.T) {
	p := newEnginePools(t)
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"group size", func(c *Config) { c.GroupSize = trace.MaxGroupSize + 1 }, "group_size 4097: above the bound of 4096"},
		{"buffer name", func(c *Config) { c.Buffers[2].Name = "KV\n2" }, `buffer 2 name "KV\n2": control character U+000A`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Buffers: slices.Clone(p.buffers), HookLayers: 3, PageSize: 4}
			tc.mod(&cfg)
			var out bytes.Buffer
			_, err := New(cfg, WithTransport(p.pre), withSimulated(), WithLogger(zap.NewNop()), WithTrace(&out, 0))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.ErrorContains(t, err, tc.want)
			assert.Zero(t, out.Len(), "nothing is written for an engine that did not start")

			e, err := New(cfg, WithTransport(p.pre), withSimulated(), WithLogger(zap.NewNop()))
			require.NoError(t, err, "without a trace")
			require.NoError(t, e.Close())
		})
	}
}

// Refused registrations and removals with what a trace cannot hold (a
// peer named with a control character, a page number beyond any pool)
// leave the trace readable too.
func TestRefusedCallsLeaveTheTraceReadable(t *testing.T) {
	p := newEnginePools(t)
	e, out := newTracedEngine(t, p)
	require.NoError(t, e.AddPeer(p.peer))
	ctx := t.Context()
	badPeer := goodSpec()
	badPeer.Infos[0].Peer = "d\n" + strings.Repeat("y", 2*trace.MaxNameLen)
	farPage := goodSpec()
	farPage.Room = 2
	farPage.SrcPages[1] = math.MaxInt
	farPage.Infos[0].DstPages[2] = -7
	for _, s := range []ChunkSpec{badPeer, farPage} {
		_, err := e.Register(ctx, s)
		require.Error(t, err)
	}
	require.Error(t, e.RemovePeer("gone\x7f"+strings.Repeat("z", 2*trace.MaxNameLen)))
	require.NoError(t, e.Close())
	tr, err := trace.Read(bytes.NewReader(out.Bytes()))
	require.NoError(t, err, "the engine wrote a trace its reader refuses")
	var types []string
	for _, rec := range tr.Records {
		if rec.Actor == trace.Engine {
			types = append(types, rec.Type)
		}
	}
	assert.Equal(t, []string{"AddPeerCall", "RegisterCall", "RegisterCall", "RemovePeerCall"}, types)
}

// A registration the engine would take but a trace cannot hold (more
// decode infos than trace.MaxDests) is refused while the engine traces: a
// replay needs every registration that added a chunk.
func TestUntraceableRegistrationRefusedWhileTracing(t *testing.T) {
	p := newEnginePools(t)
	spec := goodSpec()
	for len(spec.Infos) <= trace.MaxDests {
		spec.Infos = append(spec.Infos, DecodeInfo{Peer: "d", Dummy: true})
	}
	var out bytes.Buffer
	traced, err := New(Config{Buffers: p.buffers, HookLayers: 3, PageSize: 4},
		WithTransport(p.pre), withSimulated(), WithLogger(zap.NewNop()), WithTrace(&out, 0))
	require.NoError(t, err)
	require.NoError(t, traced.AddPeer(p.peer))
	_, err = traced.Register(t.Context(), spec)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "outside what the engine's trace records (tracing is on): 257 infos: above the bound of 256")
	assert.False(t, traced.HasRoom(spec.Room), "a refused registration changes nothing")
	require.NoError(t, traced.Close())
	_, err = trace.Read(bytes.NewReader(out.Bytes()))
	require.NoError(t, err)

	untraced := newEngine(t, nil)
	_, err = untraced.Register(t.Context(), spec)
	require.NoError(t, err, "without a trace")
}
