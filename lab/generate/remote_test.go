package generate

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeDecode is a remote run's decode side in this process: a pool on a
// loopback fabric, and the notices it was told. refuse, if set, answers a
// notice with an error.
type fakeDecode struct {
	t      *testing.T
	fab    *loopback.Fabric
	pool   *testbed.Decode
	spec   Spec
	refuse func(system.ChunkSpec) error

	mu      sync.Mutex
	notices []notice
}

type notice struct {
	spec system.ChunkSpec
	res  system.Result
}

func (f *fakeDecode) Open(_ context.Context, geom testbed.Geometry, spec Spec) (rdma.Transport, system.Peer, error) {
	dtr, err := f.fab.NewTransport("decode")
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = dtr.Close() })
	if f.pool, err = testbed.NewDecode(dtr, geom); err != nil {
		return nil, system.Peer{}, err
	}
	f.t.Cleanup(func() { _ = f.pool.Free() })
	ptr, err := f.fab.NewTransport("prefill")
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = ptr.Close() })
	f.spec = spec
	return ptr, f.pool.Peer("decode"), nil
}

func (f *fakeDecode) Notify(spec system.ChunkSpec, res system.Result) error {
	f.mu.Lock()
	f.notices = append(f.notices, notice{spec, res})
	f.mu.Unlock()
	if f.refuse != nil {
		return f.refuse(spec)
	}
	return nil
}

// decodeRoom decodes a room's tokens from the fake's pool, at the pages its
// notices named, and compares them with the model's: what the decode
// process does.
func (f *fakeDecode) decodeRoom(t *testing.T, m *tinylm.Model, room uint64) tinylm.Verdict {
	t.Helper()
	s := f.spec
	pages := map[int]int{}
	for _, n := range f.notices {
		if n.spec.Room != room {
			continue
		}
		rng, err := cp.ChunkRange(n.spec.Start, n.spec.End, s.PageSize, n.spec.Last)
		require.NoError(t, err)
		for p := rng.PageStart; p < rng.PageStart+rng.Pages; p++ {
			pages[p] = n.spec.Infos[0].DstPages[p]
		}
	}
	side := s.Side(m)
	total := (s.PromptTokens + s.NewTokens + s.PageSize - 1) / s.PageSize
	promptPages := (s.PromptTokens + s.PageSize - 1) / s.PageSize
	require.Len(t, pages, promptPages, "every prompt page was notified")
	// A copy of the pool's pages: the decode writes its tokens' KV.
	scratch := tinylm.NewMemPool(side.Layers*side.Kinds(), int(side.ItemLen()), total)
	cache := &tinylm.Cache{Side: side}
	for p := 0; p < total; p++ {
		if p < promptPages {
			for b := 0; b < side.Layers*side.Kinds(); b++ {
				copy(scratch.Page(b, p), f.pool.Page(b, pages[p]))
			}
		}
		cache.Pages = append(cache.Pages, tinylm.PageRef{Pool: scratch, Page: p})
	}
	e, err := m.Expect(s.RoomPrompt(m, room), s.NewTokens)
	require.NoError(t, err)
	v, err := m.CheckAgainst([][]*tinylm.Cache{{cache}}, e, e.First.Token)
	require.NoError(t, err)
	return v
}

func remote(t *testing.T, cfg Config, requests int, f *fakeDecode) *RemoteReport {
	t.Helper()
	f.t, f.fab = t, loopback.NewFabric(loopback.Options{})
	rep, err := RunRemote(context.Background(), cfg, requests, f, true, nil)
	require.NoError(t, err)
	return rep
}

// TestRemoteNotifiesEachChunkOnce: a remote run tells its decode side of
// every chunk once, when every prefill rank finished it (a CP group's
// ranks merged into one notice, their bytes added up), in order, each room
// on pages of its own; the KV it left there decodes to the model's tokens;
// the prefill's first tokens are the model's.
func TestRemoteNotifiesEachChunkOnce(t *testing.T) {
	for _, tc := range []struct {
		name, model string
		cp          int
	}{{"gqa", "tiny-gqa", 1}, {"mla cp 2", "tiny-mla", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := small(tc.model)
			cfg.CP = tc.cp
			f := &fakeDecode{}
			rep := remote(t, cfg, 2, f)
			var b strings.Builder
			rep.Text(&b, "loopback")
			require.True(t, rep.TokensEqual, b.String())
			assert.Equal(t, 6, rep.Chunks)
			require.Len(t, f.notices, 6, "3 chunks of 2 rooms, each told once")
			m, err := tinylm.New(cfg.Model)
			require.NoError(t, err)
			var bytes uint64
			used := map[int]uint64{}
			for i, n := range f.notices {
				assert.Equal(t, uint64(1+i/3), n.spec.Room, "in order")
				assert.Equal(t, i%3 == 2, n.spec.Last)
				assert.Equal(t, system.Succeeded, n.res.Status)
				assert.Equal(t, n.spec.Room, n.res.Chunk.Room)
				assert.Equal(t, n.spec.Start, n.res.Chunk.Start)
				assert.Positive(t, n.res.Stats.Bytes)
				bytes += n.res.Stats.Bytes
				for _, p := range n.spec.Infos[0].DstPages {
					if r, ok := used[p]; ok {
						assert.Equal(t, n.spec.Room, r, "decode page %d is two rooms'", p)
					}
					used[p] = n.spec.Room
				}
			}
			assert.Equal(t, rep.Bytes, bytes, "the ranks' bytes, added up")
			// Each chunk's pages, every layer: 40 tokens in pages of 4
			// are 10 pages a room (the chunks' registrations overlap on
			// no page: 16 is a multiple of 4).
			side := f.spec.Side(m)
			assert.Equal(t, uint64(2*10*side.Layers*side.Kinds())*side.ItemLen(), bytes)
			for room := uint64(1); room <= 2; room++ {
				v := f.decodeRoom(t, m, room)
				assert.True(t, v.OK(), "room %d: %+v", room, v)
				assert.Zero(t, v.MaxLogitDiff)
				first, _, err := m.Reference(f.spec.RoomPrompt(m, room), 1)
				require.NoError(t, err)
				assert.Equal(t, first.Token, rep.Rooms[room-1].FirstToken)
				assert.Equal(t, first.Token, rep.Rooms[room-1].ModelFirstToken)
			}
		})
	}
}

// TestRemoteVerdicts: the decode side's refusal of a room's chunk makes
// that room, and the run, not tokens_equal, naming the answer. The planted
// RoPE offset, with every notice accepted by a side that checks no token,
// is still caught twice: the prefill's own first token is not the model's,
// and the KV it sent decodes to other tokens than the model's.
func TestRemoteVerdicts(t *testing.T) {
	f := &fakeDecode{refuse: func(s system.ChunkSpec) error {
		if s.Room == 2 && s.Last {
			return errors.New("room 2: tokens_equal: false")
		}
		return nil
	}}
	rep := remote(t, small("tiny-gqa"), 2, f)
	assert.False(t, rep.TokensEqual)
	assert.True(t, rep.Rooms[0].OK())
	assert.Equal(t, "room 2: tokens_equal: false", rep.Rooms[1].Decode)
	var b strings.Builder
	rep.Text(&b, "loopback")
	assert.Contains(t, b.String(), "prefill: room 2: first token")
	assert.Contains(t, b.String(), "; decode: room 2: tokens_equal: false")
	assert.Contains(t, b.String(), "tokens_equal: false\n")

	cfg := small("tiny-gqa")
	cfg.Plant = PlantRoPEOffset
	f = &fakeDecode{}
	rep = remote(t, cfg, 1, f)
	assert.Empty(t, rep.Rooms[0].Decode, "the fake checks no token")
	assert.NotEqual(t, rep.Rooms[0].ModelFirstToken, rep.Rooms[0].FirstToken)
	assert.False(t, rep.TokensEqual)
	m, err := tinylm.New(cfg.Model)
	require.NoError(t, err)
	v := f.decodeRoom(t, m, 1)
	assert.False(t, v.Equal, "%+v", v)
}

// TestCheckRemote: what a remote run cannot do is refused before anything
// opens, naming the flag.
func TestCheckRemote(t *testing.T) {
	for _, tc := range []struct {
		edit     func(*Config)
		requests int
		want     string
	}{
		{func(c *Config) { c.DecodeTP = 2 }, 1, "--prefill-tp 1 --decode-tp 2 --prefill-pp 1 --decode-pp 1: a tiny model runs unsharded across processes"},
		{func(c *Config) {}, 0, "--requests 0: must be within [1, 64]"},
		{func(c *Config) { c.PromptTokens = 3000 }, 1, "--prompt-tokens 3000: a decode process checks at most 2048"},
		{func(c *Config) { c.NewTokens = 257 }, 1, "--new-tokens 257: a decode process decodes at most 256"},
		{func(c *Config) { c.Plant = PlantStalePage }, 1, "plant stale-page: not across processes"},
		{func(c *Config) { c.ChunkTokens = 2 }, 1, "--chunk-tokens 2: must be within [--page-size 4"},
	} {
		cfg := small("tiny-gqa")
		tc.edit(&cfg)
		err := CheckRemote(cfg, tc.requests)
		require.Error(t, err, tc.want)
		assert.Contains(t, err.Error(), tc.want)
		assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	}
	require.NoError(t, CheckRemote(small("tiny-mla"), 64))
}
