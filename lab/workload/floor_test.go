package workload

import (
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// planOf is cfg's geometry and schedule; cfg must be valid.
func planOf(t *testing.T, cfg Config) (geometry, *plan) {
	t.Helper()
	g, err := cfg.validate()
	require.NoError(t, err)
	p, err := newPlan(cfg, g)
	require.NoError(t, err)
	return g, p
}

// floorsOf returns the per-layer and the monolithic floors (ms) of cfg on
// the ideal timeline.
func floorsOf(t *testing.T, cfg Config) (perLayer, mono []float64) {
	t.Helper()
	g, p := planOf(t, cfg)
	ends := idealTimeline(cfg, g, p)
	return floors(cfg, g, p, true, ends), floors(cfg, g, p, false, ends)
}

// Hand-computed: a 128-page chunk of dsv3 is 128 x 64 x 1152 = 9 437 184 B
// per buffer; 400 Gb/s is 50 GB/s; the link latency is 10 us.
func TestFloorDefaultPreset(t *testing.T) {
	pl, mo := floorsOf(t, Defaults())
	require.Len(t, pl, 4)
	for r := range pl {
		// Only the MTP buffer must follow the forward's end: the last group
		// (5 layers, 0.94 ms on the link) crosses while the MTP layer
		// computes (4.096 ms). 9 437 184 B / 50e9 B/s + 10 us.
		require.InDelta(t, 0.18874368+0.01, pl[r], 1e-5, "room %d", r)
		// Monolithic: 62 buffers after the end. 585 105 408 B / 50e9 + 10 us.
		require.InDelta(t, 11.70210816+0.01, mo[r], 1e-5, "room %d", r)
	}
}

// llama70b has no hookless layer: the last group's event is the forward's
// end, so its 8 layers x 2 buffers must all cross after it.
func TestFloorWithoutHooklessLayers(t *testing.T) {
	cfg := Defaults()
	cfg.Preset = Presets["llama70b"]
	pl, mo := floorsOf(t, cfg)
	for r := range pl {
		// 16 buffers x 128 pages x 131 072 B = 268 435 456 B / 50e9 + 10 us.
		require.InDelta(t, 5.36870912+0.01, pl[r], 1e-5, "room %d", r)
		// 160 buffers: 2 684 354 560 B / 50e9 + 10 us.
		require.InDelta(t, 53.6870912+0.01, mo[r], 1e-5, "room %d", r)
	}
}

// At 100 Gb/s (12.5 GB/s) with K = 16 the last group (layers 48-60, 13
// buffers, 9.815 ms on the link) does not fit under the MTP layer (4.096
// ms): it still occupies the link 5.719 ms after the forward's end, and the
// MTP buffer (0.755 ms) queues behind it.
func TestFloorLastGroupCannotHide(t *testing.T) {
	cfg := Defaults()
	cfg.LinkGbps, cfg.GroupSize = 100, 16
	pl, mo := floorsOf(t, cfg)
	lastGroup := 13 * 9437184 / 12.5e9 * 1e3 // 9.81467136 ms
	mtp := 9437184 / 12.5e9 * 1e3            // 0.75497472 ms
	want := lastGroup - 4.096 + mtp + 0.01   // 6.48364608 ms
	require.InDelta(t, 6.48364608, want, 1e-9)
	for r := range pl {
		require.InDelta(t, want, pl[r], 1e-5, "room %d", r)
		require.InDelta(t, 62*9437184/12.5e9*1e3+0.01, mo[r], 1e-5, "room %d", r)
	}
}

// Two requests end in one forward: the second request's batch queues behind
// the first's, which is ahead of it on the link.
func TestFloorCountsWhatIsAhead(t *testing.T) {
	cfg := Defaults()
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens = 2, 4096, 8192
	_, mo := floorsOf(t, cfg)
	// One forward of 2 x 64 pages; monolithic sends room 0's 62 buffers,
	// then room 1's: 62 x 64 x 73 728 = 292 552 704 B each.
	one := 292552704 / 50e9 * 1e3
	require.InDelta(t, one+0.01, mo[0], 1e-5)
	require.InDelta(t, 2*one+0.01, mo[1], 1e-5)
}

func TestIdealLandingsServeInReadyOrder(t *testing.T) {
	const ms = 1e6 // ns
	// 1 byte per ns: a batch of n bytes takes n ns.
	land := idealLandings([]linkBatch{
		{ready: 5 * ms, bytes: 1 * ms, order: 0},
		{ready: 0, bytes: 2 * ms, order: 1},
		{ready: 1 * ms, bytes: 1 * ms, order: 2},
	}, 1e9, 10)
	// Batch 1 crosses [0, 2), batch 2 waits for it: [2, 3), batch 0 [5, 6).
	require.Equal(t, []float64{6*ms + 10, 2*ms + 10, 3*ms + 10}, []float64{float64(land[0]), float64(land[1]), float64(land[2])})
}

// shardedFloorsOf returns a sharded run's floors (ms) on the ideal timeline,
// the same for every prefill rank.
func shardedFloorsOf(t *testing.T, cfg Config) (perLayer, mono []float64) {
	t.Helper()
	g, err := cfg.validate()
	require.NoError(t, err)
	require.True(t, g.sharded)
	p, err := newPlan(cfg, g)
	require.NoError(t, err)
	ideal := idealTimeline(cfg, g, p)
	ends := func(st, _, k, l int) time.Duration {
		lo, _ := g.preReal.StageLayers(st)
		return ideal(k, lo+l) // l is numbered within the stage
	}
	return shardedFloors(cfg, g, p, true, ends), shardedFloors(cfg, g, p, false, ends)
}

// Hand-computed, llama70b (80 layers, K and V of 8 KV heads x 128 bf16 =
// 256 B per head per token), 128-page chunks of 64 tokens, every prefill
// rank on its own 50 GB/s link: at TP 4 -> 8 a rank holds 2 heads and sends
// one to each of 2 decode ranks; at TP 8 -> 16 it holds 1 and sends it to
// the 2 decode ranks that replicate it; at TP 4 -> 4 it sends its 2 heads to
// one. Each link carries a quarter of the whole tensor in all three, so the
// floors agree: per layer, the last group (8 layers x K, V) after the
// forward's end, 8 x 2 x 128 pages x 64 x 2 heads x 256 B = 67 108 864 B;
// monolithic, all 80 layers, 671 088 640 B.
func TestShardedFloorByHand(t *testing.T) {
	for _, tp := range [][2]int{{4, 8}, {8, 16}, {4, 4}} {
		cfg := Defaults()
		cfg.Preset = Presets["llama70b"]
		cfg.PrefillTP, cfg.DecodeTP = tp[0], tp[1]
		pl, mo := shardedFloorsOf(t, cfg)
		require.Len(t, pl, 4)
		for r := range pl {
			require.InDelta(t, 67108864/50e9*1e3+0.01, pl[r], 1e-5, "TP %v room %d", tp, r)
			require.InDelta(t, 671088640/50e9*1e3+0.01, mo[r], 1e-5, "TP %v room %d", tp, r)
		}
	}
	// dsv3 MLA 8 -> 16: every prefill rank holds the whole latent and sends
	// two copies (to decode ranks r and r + 8). Per layer only the MTP
	// buffer must follow the end (the last group, 2 x 5 x 9 437 184 B, 1.89
	// ms, crosses while the MTP layer computes 4.096 ms): 2 x 9 437 184 B.
	// Monolithic: 2 x 62 buffers.
	cfg := Defaults()
	cfg.PrefillTP, cfg.DecodeTP = 8, 16
	pl, mo := shardedFloorsOf(t, cfg)
	for r := range pl {
		require.InDelta(t, 2*9437184/50e9*1e3+0.01, pl[r], 1e-5, "room %d", r)
		require.InDelta(t, 2*62*9437184/50e9*1e3+0.01, mo[r], 1e-5, "room %d", r)
	}
}

// PP by hand: llama70b prefill TP 1 x PP 2 (layers [0, 40) and [40, 80))
// into decode TP 1. Per layer, stage 1's last group (8 layers x K, V x 128
// pages x 131 072 B = 268 435 456 B) follows the forward's end, as without
// PP. Monolithic, stage 0 sends its 40 layers when its own last layer ends,
// 98 ms before stage 1's (40 layers x 2.4576 ms), time enough for its 26.8
// ms on its own link; stage 1's 40 layers, 1 342 177 280 B, follow the end.
func TestShardedFloorPPByHand(t *testing.T) {
	cfg := Defaults()
	cfg.Preset = Presets["llama70b"]
	cfg.PrefillTP, cfg.DecodeTP, cfg.PrefillPP = 1, 1, 2
	pl, mo := shardedFloorsOf(t, cfg)
	for r := range pl {
		require.InDelta(t, 268435456/50e9*1e3+0.01, pl[r], 1e-5, "room %d", r)
		require.InDelta(t, 1342177280/50e9*1e3+0.01, mo[r], 1e-5, "room %d", r)
	}
}

// An impossible pairing is refused by validate, before anything is
// allocated, naming the flags and the values.
func TestShardedPairingRefused(t *testing.T) {
	cfg := Defaults()
	cfg.Preset = Presets["llama70b"]
	cfg.PrefillTP, cfg.DecodeTP = 3, 16
	_, err := cfg.validate()
	require.Error(t, err)
	require.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	require.Contains(t, err.Error(), "--prefill-tp 3 --decode-tp 16 (--model llama70b): prefill: 8 KV heads do not split over TP 3")
}

// TestPlanCountsEachRequestsChunks: the transfer workers' queues are sized
// by a request's own chunks. Sized by the number of forwards, they made the
// sim's memory grow with requests x forwards (65 536 small requests took
// 5.3 GB).
func TestPlanCountsEachRequestsChunks(t *testing.T) {
	cfg := Defaults()
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens = 1000, 100, 512
	_, p := planOf(t, cfg)
	total := 0
	for _, fw := range p.forwards {
		total += len(fw)
	}
	sum := 0
	for r, n := range p.chunks {
		require.Positive(t, n, "request %d", r)
		sum += n
	}
	assert.Equal(t, total, sum, "every piece of every forward is one of its request's chunks")
	assert.Greater(t, len(p.forwards), 100, "many forwards")
	assert.LessOrEqual(t, sum, 2*cfg.Requests, "a 100-token request spans at most two forwards of 512 tokens")
}

// The lower bound the oracle holds each request to is its own batches
// alone on the link: two requests ending in one forward each get the
// monolithic send of one request (the floor puts room 1 behind room 0).
func TestLowerBoundIgnoresOtherRequests(t *testing.T) {
	cfg := Defaults()
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens = 2, 4096, 8192
	g, p := planOf(t, cfg)
	ends := idealTimeline(cfg, g, p)
	mo := lowerBounds(cfg, g, p, false, ends)
	one := 292552704 / 50e9 * 1e3
	require.InDelta(t, one+0.01, mo[0], 1e-5)
	require.InDelta(t, one+0.01, mo[1], 1e-5)
	// On the default preset (one request ends per forward) it is the floor.
	cfg = Defaults()
	g, p = planOf(t, cfg)
	ends = idealTimeline(cfg, g, p)
	assert.Equal(t, floors(cfg, g, p, true, ends), lowerBounds(cfg, g, p, true, ends))
}

// Many rooms in one forward, by hand: kvstream bench scale's rooms axis at
// 16 rooms (dsv3 with 64 hook layers, one forward of 16 384 tokens, 1 024 a
// room, pages of 16). Each group (8 layers x 16 rooms x 1 024 x 1 152 B =
// 151 MB, 3.02 ms on the link) crosses while the next 8 layers compute (8.192
// ms each), the last one under the MTP layer; what follows the end is the
// 16 rooms' MTP buffers, 1 179 648 B (23.6 us) each, in registration order:
// room r lands (r + 1) x 23.6 us + 10 us after the end.
func TestFloorManyRoomsInOneForward(t *testing.T) {
	cfg := Defaults()
	cfg.Layers, cfg.Requests, cfg.PageSize, cfg.PromptTokens, cfg.ChunkTokens, cfg.Scale = 64, 16, 16, 1024, 16384, 64
	pl, _ := floorsOf(t, cfg)
	require.Len(t, pl, 16)
	for r := range pl {
		// Each batch's time on the link is truncated to the nanosecond:
		// up to 1 ns early per batch ahead (at most 16 x 9 here).
		require.InDelta(t, float64(r+1)*1179648/50e9*1e3+0.01, pl[r], 2e-4, "room %d", r)
	}
}

// The same forward sharded to 32 decode ranks (the destinations axis at
// 32): the one prefill rank sends the whole latent to each, 32 x 65 buffers
// x 16 384 x 1 152 B = 39 258 685 440 B, 785.17 ms on its link, while the
// forward computes 65 x 8.192 = 532.48 ms. From the first group's event
// (layer 7's end, 65.536 ms) the link never idles (a group of 96.6 ms
// arrives every 65.5 ms), so the forward's last byte lands 65.536 + 785.17
// ms after the start: 318.24 ms after the end. That instant is a bound on
// the forward's last landing whatever the order (the link is busy from the
// first instant any batch is ready to the last byte); a single room's
// floor, its place in the ideal sender's order, is not: a sender that
// serves the rooms one after the other lands the first rooms well before
// theirs (room 0's floor is 15 rooms' MTP copies, 15 x 0.755 ms, earlier),
// so the mean over rooms can come out under the mean floor.
func TestShardedFloorManyRoomsByHand(t *testing.T) {
	cfg := Defaults()
	cfg.Layers, cfg.Requests, cfg.PageSize, cfg.PromptTokens, cfg.ChunkTokens, cfg.Scale = 64, 16, 16, 1024, 16384, 64
	cfg.DecodeTP = 32
	pl, _ := shardedFloorsOf(t, cfg)
	require.Len(t, pl, 16)
	last := 65.536 + 39258685440/50e9*1e3 - 532.48 + 0.01 // 318.2397088 ms
	mtp := 32 * 1179648 / 50e9 * 1e3                      // one room's MTP buffer to every rank: 0.755 ms
	for r := range pl {
		// Up to 1 ns early per batch ahead: 16 rooms x 32 ranks x 9
		// batches = 4 608.
		require.InDelta(t, last-float64(15-r)*mtp, pl[r], 5e-3, "room %d", r)
	}
}
