package system

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// registerCounter counts the registrations New asks of its transport.
type registerCounter struct {
	rdma.Transport
	registered atomic.Int64
}

func (t *registerCounter) Register(addr, length uint64) (rdma.Region, error) {
	t.registered.Add(1)
	return t.Transport.Register(addr, length)
}

func noEnv(string) string { return "" }

// newRefused runs New on c over tr, which must refuse it as bad input
// naming want, without a panic, an engine, or a registration.
func newRefused(t *testing.T, c Config, tr *registerCounter, want string) {
	t.Helper()
	var e *Engine
	var err error
	start := time.Now()
	require.NotPanics(t, func() {
		e, err = New(c, WithTransport(tr), withSimulated(), WithLogger(zap.NewNop()), WithGetenv(noEnv))
	})
	if e != nil {
		_ = e.Close()
	}
	require.Error(t, err)
	assert.Nil(t, e)
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, want)
	assert.Zero(t, tr.registered.Load(), "New registered buffers before it refused the configuration")
	assert.Less(t, time.Since(start), 10*time.Second, "New took long to refuse")
}

// New bounded HookLayers and Submitters below only: math.MaxInt hook
// layers in groups of 2 panicked in makeslice (the group count wrapped),
// 1<<40 in groups of 1 ran out of memory, a million submitters (one actor
// and worker each) were still starting after 30 s at 4.6 GB; page size
// and CP size had no bound either, and an unknown replica rule passed New
// to fail at the first AddPeer. Each is refused naming the field and its
// value, before anything is allocated or registered.
func TestNewRefusesConfigBeyondBounds(t *testing.T) {
	p := newEnginePools(t)
	model := &GroupModel{LinkBytesPerSec: 1e9, PagesPerForward: 1, LayerTime: time.Microsecond}
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"hook layers MaxInt", func(c *Config) { c.HookLayers, c.GroupSize = math.MaxInt, 2 }, "hook layers 9223372036854775807: must be at most 4096"},
		{"hook layers 2^40", func(c *Config) { c.HookLayers, c.GroupSize = 1<<40, 1 }, "hook layers 1099511627776: must be at most 4096"},
		{"hook layers 4097", func(c *Config) { c.HookLayers = MaxHookLayers + 1 }, "hook layers 4097: must be at most 4096"},
		{"submitters 1e6", func(c *Config) { c.Submitters = 1_000_000 }, "submitters 1000000: must be at most 1024"},
		{"submitters 2^40", func(c *Config) { c.Submitters = 1 << 40 }, "submitters 1099511627776: must be at most 1024"},
		{"page size", func(c *Config) { c.PageSize = 1<<16 + 1 }, "page size 65537: must be at most 65536"},
		{"CP size MaxInt", func(c *Config) { c.CP = cp.CP{Size: math.MaxInt, Rank: math.MaxInt - 1} }, "CP size 9223372036854775807: must be at most 1024"},
		{"CP size 1025", func(c *Config) { c.CP = cp.CP{Size: 1025} }, "CP size 1025: must be at most 1024"},
		{"replicas", func(c *Config) { c.Replicas = 7 }, "replicas 7: unknown"},
		{"replicas negative", func(c *Config) { c.Replicas = -1 }, "replicas -1: unknown"},
		{"auto group NaN", func(c *Config) { m := *model; m.ItemScale = math.NaN(); c.AutoGroup = &m }, "auto group: item scale NaN"},
		{"auto group layer time", func(c *Config) { m := *model; m.LayerTime = math.MaxInt64 / 2; c.AutoGroup = &m }, "auto group: layer time 1281023h53m38.427387903s"},
		// Last: without the bound, the model's O(F²) loops hang here.
		{"auto group hook layers", func(c *Config) { c.HookLayers, c.AutoGroup = 300_000, model }, "hook layers 300000: must be at most 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Buffers: p.buffers, HookLayers: 3, PageSize: 4}
			tc.set(&c)
			_, err := c.withDefaults(noEnv)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.ErrorContains(t, err, tc.want)
			newRefused(t, c, &registerCounter{Transport: p.pre}, tc.want)
		})
	}
	// The bounds themselves are accepted.
	c, err := Config{Buffers: p.buffers, HookLayers: MaxHookLayers, Submitters: MaxSubmitters, PageSize: MaxPageSize,
		CP: cp.CP{Size: MaxCPSize, Rank: MaxCPSize - 1}, Replicas: reshard.FirstReplica}.withDefaults(noEnv)
	require.NoError(t, err)
	assert.Equal(t, MaxSubmitters, c.Submitters)

	// KVSTREAM_SUBMITTERS has the bound too, named as the variable.
	env := func(k string) string {
		if k == EnvSubmitters {
			return "2000"
		}
		return ""
	}
	for _, err := range []error{checkEnv(env), func() error { _, err := (Config{HookLayers: 1}).withDefaults(env); return err }()} {
		require.Error(t, err)
		assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
		assert.ErrorContains(t, err, `KVSTREAM_SUBMITTERS="2000": want a positive integer of at most 1024`)
	}
}

// The bounds that package plan keeps for itself (it may not import trace)
// are the trace's.
func TestPlanBoundsAreTheTraces(t *testing.T) {
	assert.Equal(t, trace.MaxHookLayers, plan.MaxHookLayers)
	assert.Equal(t, trace.MaxPages, plan.MaxPages)
	assert.Equal(t, trace.MaxItemLen, plan.MaxItemLen)
	assert.Equal(t, trace.MaxHookLayers, MaxHookLayers)
	assert.Equal(t, trace.MaxSubmitters, MaxSubmitters)
}

// registerPool registered ItemLen × Pages as computed, wrapped: a buffer of
// item length 2^63+1024 and 2 pages registered 2048 bytes while the layout
// addressed page 1 at Base+2^63+1024. A buffer's item length and pages are
// bounded and its end must not wrap; every buffer is checked before any is
// registered, and the error names the buffer.
func TestNewRefusesWrappingBuffer(t *testing.T) {
	p := newEnginePools(t)
	blk, err := hostmem.Alloc(4096)
	require.NoError(t, err)
	t.Cleanup(func() { _ = blk.Free() })
	good := Buffer{Name: "KV0", Base: blk.Addr, ItemLen: 1024, Pages: 2, Layer: 0}
	for _, tc := range []struct {
		name string
		bad  Buffer
		want string
	}{
		{"item length wraps", Buffer{Name: "KV1", Base: blk.Addr + 2048, ItemLen: 1<<63 + 1024, Pages: 2, Layer: 1},
			"buffer 1 (KV1): item length 9223372036854776832: must be at most 268435456"},
		{"pages", Buffer{Name: "KV1", Base: blk.Addr + 2048, ItemLen: 1, Pages: MaxPages + 1, Layer: 1},
			"buffer 1 (KV1): 16777217 pages: must be at most 16777216"},
		{"end wraps", Buffer{Name: "KV1", Base: math.MaxUint64 - 1023, ItemLen: 1024, Pages: 2, Layer: 1},
			"buffer 1 (KV1): [0xfffffffffffffc00, +2048) wraps around"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Buffers: []Buffer{good, tc.bad}, HookLayers: 2, PageSize: 16}
			newRefused(t, c, &registerCounter{Transport: p.pre}, tc.want)
		})
	}
	n, err := bufferLen(0, Buffer{Name: "KV0", Base: 1 << 40, ItemLen: MaxItemLen, Pages: MaxPages})
	require.NoError(t, err)
	assert.Equal(t, uint64(1)<<52, n)
}

// AddPeer took a region at MaxUint64-1023 of 1 MiB (it wraps around the
// address space: its writes failed later, a submitter restart storm), a
// region of 2^63 bytes (2^63 pages of 1 byte made the page count negative:
// the next Register failed as "planning ... panicked (a bug)" with the
// peer still added), and one that is no whole number of pages. Each is
// refused naming the peer and the buffer, and adds nothing: the same id
// is then added with good buffers.
func TestAddPeerRefusesBadRegions(t *testing.T) {
	e := newEngine(t, nil)
	other := newEnginePools(t).peer
	for _, tc := range []struct {
		name string
		set  func(*PeerBuffer)
		buf  int
		want string
	}{
		{"wraps", func(b *PeerBuffer) { b.Region.Addr, b.Region.Len = math.MaxUint64-1023, 1<<20 }, 1,
			`peer "x" buffer 1: region [0xfffffffffffffc00, +1048576) wraps around`},
		{"2^63 bytes", func(b *PeerBuffer) { b.Region.Len = 1 << 63 }, 0,
			`peer "x" buffer 0: region of 9223372036854775808 bytes holds 288230376151711744 pages of 32 bytes: must be at most 16777216`},
		{"not whole pages", func(b *PeerBuffer) { b.Region.Len = itemLen*pages + 1 }, 3,
			`peer "x" buffer 3: region of 513 bytes is not a whole number of 32-byte pages`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := other
			bad.ID = "x"
			bad.Buffers = append([]PeerBuffer(nil), other.Buffers...)
			tc.set(&bad.Buffers[tc.buf])
			var err error
			require.NotPanics(t, func() { err = e.AddPeer(bad) })
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.ErrorContains(t, err, tc.want)

			spec := goodSpec()
			spec.Infos[0].Peer = "x"
			_, err = e.Register(t.Context(), spec)
			assert.ErrorContains(t, err, `unknown peer "x"`, "the refused peer was added")
			good := other
			good.ID = "x"
			require.NoError(t, e.AddPeer(good), "the refused peer left a record")
			require.NoError(t, e.RemovePeer("x"))
		})
	}
}

// The same with 1-byte pages, the case that reached Register: a region of
// 2^63 of them made PeerBuffer.Pages negative.
func TestAddPeerRefusesNegativePages(t *testing.T) {
	p := newEnginePools(t)
	bufs := MLABuffers([]uint64{p.buffers[0].Base}, 1, itemLen*pages)
	e, err := New(Config{Buffers: bufs, HookLayers: 1, PageSize: 4}, WithTransport(p.pre), withSimulated(), WithLogger(zap.NewNop()), WithGetenv(noEnv))
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	peer := Peer{ID: "x", Address: p.peer.Address, Buffers: []PeerBuffer{{Region: p.peer.Buffers[0].Region, ItemLen: 1}}}
	peer.Buffers[0].Region.Len = 1 << 63
	err = e.AddPeer(peer)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, `peer "x" buffer 0: region of 9223372036854775808 bytes holds 9223372036854775808 pages of 1 bytes: must be at most 16777216`)
	_, err = e.Register(t.Context(), ChunkSpec{Room: 1, End: 16, Last: true, SrcPages: []int{0, 1, 2, 3}, TotalPages: 4,
		Infos: []DecodeInfo{{Peer: "x", DstPages: []int{0, 1, 2, 3}}}})
	assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, `unknown peer "x"`)
}

// ChooseGroup took an item scale of NaN or Inf, and a layer time or a link
// so slow that the modeled instants overflowed a Duration, and chose a
// meaningless K; 300 000 hook layers hung its O(F²) loops. Each is refused
// naming the field.
func TestChooseGroupRefusesBadModel(t *testing.T) {
	base := GroupModel{LinkBytesPerSec: 50e9, Latency: 10 * time.Microsecond, PagesPerForward: 128, LayerTime: 4096 * time.Microsecond}
	for _, tc := range []struct {
		name  string
		set   func(*GroupModel)
		hooks int
		want  string
	}{
		{"item scale NaN", func(m *GroupModel) { m.ItemScale = math.NaN() }, 61, "auto group: item scale NaN: must be positive and finite"},
		{"item scale Inf", func(m *GroupModel) { m.ItemScale = math.Inf(1) }, 61, "auto group: item scale +Inf: must be positive and finite"},
		{"item scale negative", func(m *GroupModel) { m.ItemScale = -1 }, 61, "auto group: item scale -1: must be positive and finite"},
		{"item scale huge", func(m *GroupModel) { m.ItemScale = 1e300 }, 61, "auto group: link rate 5e+10 bytes/s, item scale 1e+300: +Inf bytes per forward"},
		{"link rate NaN", func(m *GroupModel) { m.LinkBytesPerSec = math.NaN() }, 61, "auto group: link rate NaN bytes/s: must be positive and finite"},
		{"link rate tiny", func(m *GroupModel) { m.LinkBytesPerSec = 1e-300 }, 61, "auto group: link rate 1e-300 bytes/s, item scale 1: 5.851e+08 bytes per forward"},
		{"layer time", func(m *GroupModel) { m.LayerTime = math.MaxInt64 / 2 }, 61,
			fmt.Sprintf("auto group: layer time %v: 62 layers of it exceed", time.Duration(math.MaxInt64/2))},
		{"layer time negative", func(m *GroupModel) { m.LayerTime = -1 }, 61, "auto group: layer time -1ns: must not be negative"},
		{"latency", func(m *GroupModel) { m.Latency = math.MaxInt64 }, 61, fmt.Sprintf("latency %v and", time.Duration(math.MaxInt64))},
		{"batch overhead", func(m *GroupModel) { m.BatchOverhead = math.MaxInt64 / 2 }, 61, fmt.Sprintf("batch overhead %v, latency", time.Duration(math.MaxInt64/2))},
		{"max batches", func(m *GroupModel) { m.MaxBatches = -3 }, 61, "auto group: max batches -3: must not be negative"},
		// Last: without the bound, this hangs.
		{"hook layers", func(*GroupModel) {}, 300_000, "auto group: hook layers 300000: must be at most 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base
			tc.set(&m)
			var err error
			require.NotPanics(t, func() { _, err = ChooseGroup(m, dsv3Buffers(), tc.hooks) })
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// At the bound, with no batch bound to speak of, the model tries every K
// over every layer: quick enough for New.
func TestChooseGroupAtTheBound(t *testing.T) {
	bases := make([]uint64, MaxHookLayers+1)
	for i := range bases {
		bases[i] = uint64(i+1) << 32
	}
	m := GroupModel{LinkBytesPerSec: 50e9, Latency: 10 * time.Microsecond, PagesPerForward: 128, LayerTime: 100 * time.Microsecond, MaxBatches: math.MaxInt}
	start := time.Now()
	ch, err := ChooseGroup(m, MLABuffers(bases, 73728, 512), MaxHookLayers)
	require.NoError(t, err)
	assert.Len(t, ch.Candidates, MaxHookLayers)
	t.Logf("%d hook layers: %v", MaxHookLayers, time.Since(start))
}
