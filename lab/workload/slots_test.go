package workload

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A slot is handed on only when every rank finished its request's last
// chunk; the room released is the one that held it.
func TestResidencyWaitsForEveryRank(t *testing.T) {
	p := &plan{resident: 2}
	var released []int
	rs := newResidency(p, 5, 2, func(room int) { released = append(released, room) })
	ctx := context.Background()
	require.NoError(t, rs.admit(ctx, 0))
	require.NoError(t, rs.admit(ctx, 1))
	assert.Empty(t, released, "rooms 0 and 1 take free slots")

	// Room 2 takes room 0's slot. After one rank of two finished room 0,
	// an admit that may not wait gives up: it would have waited (a
	// goroutine's admit checked at once could not tell, it may not have
	// run yet).
	rs.finished(0) // one rank of two
	impatient, giveUp := context.WithCancel(ctx)
	giveUp()
	require.ErrorIs(t, rs.admit(impatient, 2), context.Canceled, "room 2 admitted before room 0's second rank finished")
	assert.Empty(t, released, "a cancelled wait releases nothing")
	require.Equal(t, 1, rs.slotWaits())
	// An admit that waits is woken by the last rank's finish.
	admitted := make(chan error, 1)
	go func() { admitted <- rs.admit(ctx, 2) }()
	require.Eventually(t, func() bool { return rs.slotWaits() == 2 }, 10*time.Second, time.Millisecond, "room 2's admit never waited")
	rs.finished(0)
	require.NoError(t, <-admitted)
	assert.Equal(t, []int{0}, released)

	rs.finished(1)
	rs.finished(1)
	require.NoError(t, rs.admit(ctx, 3))
	assert.Equal(t, []int{0, 1}, released)
	from, to := rs.stillResident()
	assert.Equal(t, [2]int{3, 5}, [2]int{from, to})

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, rs.admit(cctx, 4), context.Canceled, "room 2 never finished")
	assert.Equal(t, []int{0, 1}, released, "a cancelled wait releases nothing")
}

// The pools hold the resident requests' pages, however many requests the
// run has.
func TestPoolsHoldTheResidentRequests(t *testing.T) {
	sizes := map[int]int{}
	for _, requests := range []int{100, 10000} {
		cfg := Defaults()
		cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens = requests, 100, 512
		g, err := cfg.validate()
		require.NoError(t, err)
		assert.Equal(t, 4*(512/100+2), g.resident, "four forwards of up to 7 requests each")
		p, err := newPlan(cfg, g)
		require.NoError(t, err)
		sizes[requests] = p.pool
		assert.Equal(t, g.pagesPerRequest*g.resident, p.pool)
		for r := 0; r < requests; r += 97 {
			require.Len(t, p.src(r), g.pagesPerRequest)
			assert.Equal(t, p.src(r), p.src(r+g.resident), "room %d hands its pages to room %d", r, r+g.resident)
		}
	}
	assert.Equal(t, sizes[100], sizes[10000])
}

// Many more requests than slots, with a slot per forward's requests only
// and a link whose 50 ms latency dwarfs a forward (tens of microseconds of
// modeled compute, and of the host's work even on a loaded machine):
// rooms reuse pages while transfers lag, so the forward loop waits for
// slots; every byte is checked, before each reuse and at the end,
// unsharded and sharded.
func TestRunReusesSlots(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"unsharded MLA", func(c *Config) {}},
		{"llama70b TP 2 -> 4", func(c *Config) {
			c.Preset = Presets["llama70b"]
			c.Layers, c.Scale = 4, 16 // the heads' bytes are hashed per token: keep them few
			c.PrefillTP, c.DecodeTP = 2, 4
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			cfg.Preset = Presets["small"]
			cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize = 8, 128, 128, 64
			cfg.Resident = 2
			cfg.LayerUsPerKTok = 100
			cfg.LinkLatency = 50 * time.Millisecond
			tc.edit(&cfg)
			rep, err := Run(context.Background(), cfg, nil)
			require.NoError(t, err)
			assert.True(t, rep.BytesEqual, rep.Mismatch)
			assert.Equal(t, 2, rep.Resident)
			assert.Len(t, rep.PerLayer.PerRequest, 8)
			assert.Positive(t, rep.PerLayer.SlotWaits, "per layer: the transfers lag, the loop waits")
			assert.Positive(t, rep.Monolithic.SlotWaits, "monolithic: the transfers lag, the loop waits")
		})
	}
}

// A release checks the request it hands back, naming it, and clears its
// decode pages for the next one.
func TestReleaseChecksAndClears(t *testing.T) {
	cfg := Defaults()
	cfg.Preset = Presets["small"]
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize = 3, 128, 128, 64
	cfg.Resident = 2
	g, err := cfg.validate()
	require.NoError(t, err)
	p, err := newPlan(cfg, g)
	require.NoError(t, err)
	geom := testbed.MLA(g.layers, uint64(g.itemLen), p.pool)
	l := &localPlane{cfg: cfg, g: g, p: p}
	_, err = l.open(context.Background(), nil)
	require.NoError(t, err)
	defer l.close()
	pool, err := testbed.NewPool(geom)
	require.NoError(t, err)
	defer func() { require.NoError(t, pool.Free()) }()
	l.prefill([]*testbed.Pool{pool})

	// Room 0 landed whole: its release finds nothing.
	for x := 0; x < g.pagesPerRequest; x++ {
		for b := 0; b < geom.Buffers(); b++ {
			testbed.Fill(pool.Page(b, p.src(0)[x]), cfg.Seed, 0, b, x)
			copy(l.decode.Page(b, p.dst(0)[x]), pool.Page(b, p.src(0)[x]))
		}
	}
	l.Release(0)
	assert.Empty(t, l.released.get())
	for b := 0; b < geom.Buffers(); b++ {
		assert.Equal(t, make([]byte, g.itemLen), l.decode.Page(b, p.dst(0)[1]), "buffer %d cleared", b)
	}

	// Room 1 lost one byte of position 1, buffer 3.
	for x := 0; x < g.pagesPerRequest; x++ {
		for b := 0; b < geom.Buffers(); b++ {
			testbed.Fill(pool.Page(b, p.src(1)[x]), cfg.Seed, 1, b, x)
			copy(l.decode.Page(b, p.dst(1)[x]), pool.Page(b, p.src(1)[x]))
		}
	}
	l.decode.Page(3, p.dst(1)[1])[5] ^= 1
	l.Release(1)
	msg := l.verify(1, 1)
	assert.Contains(t, msg, "room 1 position 1")
	assert.Contains(t, msg, "buffer KV3")
	assert.Contains(t, msg, "when its slot was released")
}

// A notice being sent (the other process checking the previous chunk)
// does not hold the worker back; a slot's notices go in order, and a
// request's after runs once its last notice was sent.
func TestNotifierDoesNotHoldTheWorker(t *testing.T) {
	var mu sync.Mutex
	sent := map[int][]int{} // room -> chunk starts, in the order sent
	gate := make(chan struct{})
	nt := newNotifier(2, 4, func(n Notice) {
		<-gate
		mu.Lock()
		sent[int(n.Room)] = append(sent[int(n.Room)], n.Start)
		mu.Unlock()
	})
	released := make(chan int, 2)
	for _, room := range []int{0, 1} {
		nt.notify(room, Notice{Room: uint64(room), Start: 0}, nil)
		nt.notify(room, Notice{Room: uint64(room), Start: 128}, nil)
		nt.notify(room, Notice{Room: uint64(room), Start: 256}, func() {
			mu.Lock()
			defer mu.Unlock()
			assert.Len(t, sent[room], 3, "room %d released after its last notice", room)
			released <- room
		})
	}
	// Every notify above returned while no notice could be sent.
	mu.Lock()
	assert.Empty(t, sent)
	mu.Unlock()
	close(gate)
	got := []int{<-released, <-released}
	assert.ElementsMatch(t, []int{0, 1}, got)
	nt.close()
	assert.Equal(t, map[int][]int{0: {0, 128, 256}, 1: {0, 128, 256}}, sent)
}
