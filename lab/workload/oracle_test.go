package workload

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// oracleConfig is one forward of one request on the small preset (8 hook
// layers and the MTP layer, buffers KV0..KV8), with layers long enough (50
// ms each) that an early read happens well inside the writing kernel.
func oracleConfig() Config {
	cfg := Defaults()
	cfg.Preset = Presets["small"]
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens = 1, 1024, 1024
	cfg.LayerUsPerKTok = 50000 / 1.024
	cfg.GroupSize = 4
	cfg.Submitters = 2
	return cfg
}

func TestOracleAcceptsTheEngine(t *testing.T) {
	rep, err := Run(context.Background(), oracleConfig(), nil)
	require.NoError(t, err)
	assert.True(t, rep.BytesEqual, rep.Mismatch)
	// Every batch that landed says how late the emulated link landed it.
	for _, m := range []*ModeReport{rep.PerLayer, rep.Monolithic} {
		assert.Equal(t, m.Batches, m.LinkLag.N, "a lag per batch landed (%s)", m.mode())
		assert.GreaterOrEqual(t, m.LinkLag.P50, 0.0)
	}
}

// The sharded run's check catches what a wrong engine does, at Finish: two
// GQA prefill engines told each other's TP rank send their heads as the
// other's; MLA ranks that disagree on which replica sends leave decode ranks
// empty. (An engine with a sharding refuses the early-send plant of
// TestOracleCatchesEarlySends itself: its buffers must be the stage's
// layers, one latent each.)
func TestShardedOracle(t *testing.T) {
	gqa := func() Config {
		cfg := oracleConfig()
		cfg.Preset = Presets["llama70b"]
		cfg.Layers = 4
		cfg.PromptTokens, cfg.ChunkTokens, cfg.LayerUsPerKTok = 256, 256, 1000
		cfg.PrefillTP, cfg.DecodeTP = 2, 4
		return cfg
	}
	swap := func(r int, c *system.Config) {
		if r < 2 {
			s := *c.Sharding
			s.Rank.TP = 1 - r
			c.Sharding = &s
		}
	}
	for _, tc := range []struct {
		name string
		cfg  func() Config
		want []string // empty: bytes equal
	}{
		{"GQA TP 2->4 passes", gqa, nil},
		{"GQA TP 2->4 with ranks swapped", func() Config { c := gqa(); c.plantShard = swap; return c }, []string{"per-layer: decode TP rank", "buffer K0"}},
		// Rank 1 told to leave every copy to replica 0 while rank 0 sends
		// only the even decode ranks' (the default rule): the odd ones get
		// nothing.
		{"MLA TP 2->4 with the ranks disagreeing on the replica rule", func() Config {
			c := oracleConfig()
			c.PrefillTP, c.DecodeTP = 2, 4
			c.plantShard = func(r int, ec *system.Config) {
				if r == 1 {
					ec.Replicas = reshard.FirstReplica
				}
			}
			return c
		}, []string{"per-layer: decode TP rank 1", "buffer KV0", "at Finish SUCCESS", "zeros (never written)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Run(context.Background(), tc.cfg(), nil)
			require.NoError(t, err)
			if len(tc.want) == 0 {
				assert.True(t, rep.BytesEqual, rep.Mismatch)
				return
			}
			assert.False(t, rep.BytesEqual)
			for _, w := range tc.want {
				assert.Contains(t, rep.Mismatch, w)
			}
			t.Log(rep.Mismatch)
		})
	}
}

// lyingTransport plays an engine bug below it: it wraps every endpoint so
// that the batches lie picks report completion at once (done runs on its own
// goroutine, as the contract wants) while the real batch goes on, or edits
// the writes (edit) before they go on.
type lyingTransport struct {
	rdma.Transport
	lie  func(ws []rdma.Write) bool
	edit func(ws []rdma.Write) []rdma.Write
}

func (t *lyingTransport) Connect(addr []byte) (rdma.Endpoint, error) {
	ep, err := t.Transport.Connect(addr)
	if err != nil {
		return nil, err
	}
	return &lyingEndpoint{Endpoint: ep, t: t}, nil
}

type lyingEndpoint struct {
	rdma.Endpoint
	t *lyingTransport
}

func (e *lyingEndpoint) Post(ws []rdma.Write, done func(error)) error {
	if e.t.edit != nil {
		ws = e.t.edit(ws)
	}
	if e.t.lie == nil || !e.t.lie(ws) {
		return e.Endpoint.Post(ws, done)
	}
	if err := e.Endpoint.Post(ws, func(error) {}); err != nil {
		return err
	}
	go done(nil)
	return nil
}

// heldFirst plants a SUCCESS with a batch in flight: the engine is told
// that the first batch it posts (group 0 of the first chunk) completed at
// once, while the link keeps that batch for the rest of the run, so that
// it is in flight, whatever the machine's speed, when the engine answers
// SUCCESS on the lie.
type heldFirst struct {
	mu      sync.Mutex
	picked  uint64 // the first batch's destination
	holding bool
}

func (h *heldFirst) plant(c *Config) {
	c.plantTransport = func(tr rdma.Transport) rdma.Transport { return &lyingTransport{Transport: tr, lie: h.lie} }
	c.plantSlow = h.slow
}

func (h *heldFirst) lie(ws []rdma.Write) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.picked != 0 || len(ws) == 0 {
		return false
	}
	h.picked = ws[0].Dst
	return true
}

func (h *heldFirst) slow(b loopback.BatchInfo) loopback.Slowdown {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.picked != 0 && b.Dst == h.picked && !h.holding {
		h.holding = true // that batch only, not the monolithic run's
		return loopback.Slowdown{Extra: time.Hour}
	}
	return loopback.Slowdown{}
}

// The oracles together catch each planted engine bug and name room, page
// and buffer: the byte check catches wrong or missing bytes, the transport
// guard a SUCCESS with a batch still in flight (bytes the loopback put in
// place ahead of the modeled landing would pass the byte check).
func TestOracleCatchesPlantedBugs(t *testing.T) {
	var mu sync.Mutex
	var first *heldFirst
	// skipFirstPage leaves out the first page of the first write of the
	// first batch.
	skipped := false
	skipFirstPage := func(ws []rdma.Write) []rdma.Write {
		mu.Lock()
		defer mu.Unlock()
		if skipped || len(ws) == 0 {
			return ws
		}
		skipped = true
		item := uint64(oracleItemLen())
		out := append([]rdma.Write(nil), ws...)
		if out[0].Len > item {
			out[0].Src += item
			out[0].Dst += item
			out[0].Len -= item
			return out
		}
		return out[1:]
	}
	for _, tc := range []struct {
		name  string
		setup func(*Config)
		want  []string
	}{
		{"SUCCESS with one batch in flight", func(c *Config) { first.plant(c) }, []string{"oracle", "per-layer: room 0 chunk 0-1024", "decode page", "buffer KV0", "still in flight"}},
		// The early reads below happen 200 ms or more before the kernel
		// they precede ends (layers of 200 ms): a stalled machine does not
		// turn them into correct reads.
		{"a group sent early", func(c *Config) {
			c.LayerUsPerKTok = 200000 / 1.024
			c.plant = func(b []system.Buffer) { b[5].Layer = 1 }
		},
			[]string{"bytes", "per-layer: room 0", "decode page", "buffer KV5", "at Finish SUCCESS"}},
		{"the MTP buffer with the last group", func(c *Config) {
			c.LayerUsPerKTok = 200000 / 1.024
			c.plant = func(b []system.Buffer) { b[8].Layer = 7 }
		},
			[]string{"bytes", "per-layer: room 0", "decode page", "buffer KV8", "at Finish SUCCESS"}},
		{"a skipped page", func(c *Config) {
			c.plantTransport = func(tr rdma.Transport) rdma.Transport { return &lyingTransport{Transport: tr, edit: skipFirstPage} }
		}, []string{"bytes", "per-layer: room 0", "decode page", "buffer KV0", "at Finish SUCCESS", "zeros (never written)"}},
		// Every write posted twice: the right bytes in the right places,
		// so the byte check passes; the ledger counts twice the bytes the
		// pages hold.
		{"every byte twice", func(c *Config) {
			c.plantTransport = func(tr rdma.Transport) rdma.Transport {
				return &lyingTransport{Transport: tr, edit: func(ws []rdma.Write) []rdma.Write { return append(slices.Clip(ws), ws...) }}
			}
		}, []string{"oracle", "per-layer: room 0 chunk 0-1024 decode rank 0", "bytes landed", "every byte 2 times"}},
		// KV7 moved into group 0 is read at layer 3's end, three kernels
		// (600 ms) before its own starts: the prefill pool's stale bytes.
		{"stale bytes", func(c *Config) {
			c.LayerUsPerKTok = 200000 / 1.024
			c.plant = func(b []system.Buffer) { b[7].Layer = 0 }
		},
			[]string{"bytes", "per-layer: room 0", "decode page", "buffer KV7", "at Finish SUCCESS", "stale prefill bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			skipped, first = false, &heldFirst{}
			mu.Unlock()
			cfg := oracleConfig()
			tc.setup(&cfg)
			rep, err := Run(context.Background(), cfg, nil)
			require.NoError(t, err)
			var got string
			switch tc.want[0] {
			case "bytes":
				assert.False(t, rep.BytesEqual)
				got = rep.Mismatch
			case "oracle":
				assert.NotEmpty(t, rep.OracleFailures)
				got = strings.Join(rep.OracleFailures, "\n")
			}
			for _, w := range tc.want[1:] {
				assert.Contains(t, got, w)
			}
			t.Log(got)
		})
	}
}

// oracleItemLen is the bytes per page the oracle's runs move.
func oracleItemLen() int {
	g, err := oracleConfig().validate()
	if err != nil {
		panic(err)
	}
	return g.itemLen
}

// An engine that reports every batch complete at once finishes below the
// bound no sender can beat: the run names the request. The link is slow
// enough (1 Mb/s: the MTP buffer alone needs 9.4 s after the forward's
// end) that the bound is beyond the finish timeout: whatever the machine's
// speed, a Finish that returns at all returns below it.
func TestOracleCatchesExposedBelowTheBound(t *testing.T) {
	cfg := oracleConfig()
	cfg.LinkGbps = 0.001
	cfg.FinishTimeout = 5 * time.Second
	cfg.plantTransport = func(tr rdma.Transport) rdma.Transport {
		return &lyingTransport{Transport: tr, lie: func([]rdma.Write) bool { return true }}
	}
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	got := strings.Join(rep.OracleFailures, "\n")
	assert.Contains(t, got, "per-layer: room 0: exposed")
	assert.Contains(t, got, "is below")
	t.Log(got)
}

// The sharded run has the transport guard below every prefill rank: an
// engine that answers SUCCESS with its first batch still in flight fails
// the run, naming the rank, room, decode page and buffer.
func TestShardedOracleCatchesABatchInFlight(t *testing.T) {
	cfg := oracleConfig()
	cfg.Preset = Presets["llama70b"]
	cfg.Layers = 4
	cfg.PromptTokens, cfg.ChunkTokens, cfg.LayerUsPerKTok = 256, 256, 1000
	cfg.PrefillTP, cfg.DecodeTP = 2, 4
	(&heldFirst{}).plant(&cfg)
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	got := strings.Join(rep.OracleFailures, "\n")
	assert.Contains(t, got, "per-layer: prefill rank")
	assert.Contains(t, got, "room 0 chunk 0-256")
	assert.Contains(t, got, "decode page")
	assert.Contains(t, got, "of decode rank")
	assert.Contains(t, got, "still in flight")
	t.Log(got)
}

// Without the check at Finish (NoCheckAtFinish, for kvstream bench scale),
// the run still fails on a SUCCESS with a batch in flight (the transport
// guard) and on a page never written (the check at release or the run's
// end), naming room, page and buffer.
func TestOracleWithoutCheckAtFinish(t *testing.T) {
	t.Run("SUCCESS with one batch in flight", func(t *testing.T) {
		cfg := oracleConfig()
		cfg.NoCheckAtFinish = true
		(&heldFirst{}).plant(&cfg)
		rep, err := Run(context.Background(), cfg, nil)
		require.NoError(t, err)
		got := strings.Join(rep.OracleFailures, "\n")
		for _, w := range []string{"per-layer: room 0 chunk 0-1024", "decode page", "buffer KV0", "still in flight"} {
			assert.Contains(t, got, w)
		}
	})
	t.Run("a skipped page", func(t *testing.T) {
		cfg := oracleConfig()
		cfg.NoCheckAtFinish = true
		var mu sync.Mutex
		skipped := false
		cfg.plantTransport = func(tr rdma.Transport) rdma.Transport {
			return &lyingTransport{Transport: tr, edit: func(ws []rdma.Write) []rdma.Write {
				mu.Lock()
				defer mu.Unlock()
				if skipped || len(ws) == 0 || ws[0].Len <= uint64(oracleItemLen()) {
					return ws
				}
				skipped = true
				out := append([]rdma.Write(nil), ws...)
				item := uint64(oracleItemLen())
				out[0].Src, out[0].Dst, out[0].Len = out[0].Src+item, out[0].Dst+item, out[0].Len-item
				return out
			}}
		}
		rep, err := Run(context.Background(), cfg, nil)
		require.NoError(t, err)
		require.True(t, skipped, "the plant took a page out")
		assert.False(t, rep.BytesEqual)
		for _, w := range []string{"per-layer: room 0", "decode page", "buffer KV0", "zeros (never written)"} {
			assert.Contains(t, rep.Mismatch, w)
		}
		assert.NotContains(t, rep.Mismatch, "at Finish SUCCESS")
		t.Log(rep.Mismatch)
	})
}
