package simsession

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/generate"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinyRun is a tiny model's remote run against a decode process, both on
// one node and one loopback fabric (what kvstream prefill --model tiny-*
// and kvstream decode do across processes over UCX).
type tinyRun struct {
	rep    *generate.RemoteReport
	byeErr error
	sum    DecodeSummary
	rooms  []RoomCheck
}

// quickTiny is a configuration sized for tests: 40 prompt tokens in chunks
// of 16 (three forwards, the last partial, the last page partial too),
// pages of 4 tokens, 6 new tokens; a seed whose prompts' greedy picks are
// all at least 0.1 from a tie for both models.
func quickTiny(model string) generate.Config {
	c := generate.Defaults()
	c.Model = tinylm.Presets[model]
	c.PromptTokens, c.ChunkTokens, c.PageSize, c.NewTokens, c.Seed = 42, 16, 4, 6, 3
	return c
}

func runTiny(t *testing.T, cfg generate.Config, requests int) tinyRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	decTr, preTr, node := loopbackPair(t)
	d, err := StartDecode(node, decTr, 64<<20, nil, nil)
	require.NoError(t, err)
	defer d.Close(context.Background())
	var mu sync.Mutex
	var out tinyRun
	served := make(chan DecodeSummary, 1)
	go func() {
		served <- d.Serve(ctx, ServeConfig{Runs: 1, DrainTimeout: 30 * time.Second, OnRoom: func(r RoomCheck) {
			mu.Lock()
			out.rooms = append(out.rooms, r)
			mu.Unlock()
		}})
	}()
	p := NewTinyPrefill(node, decode.DialConfig{Decode: d.Server.Addr(), PageSize: cfg.PageSize}, preTr, nil)
	out.rep, err = generate.RunRemote(ctx, cfg, requests, p, true, nil)
	require.NoError(t, err)
	_, out.byeErr = p.End(ctx, nil)
	out.sum = <-served
	mu.Lock()
	defer mu.Unlock()
	return out
}

// TestTinyTokensAcrossTheSession: the decode side decodes every room's
// tokens from the KV it received and finds the model's, for both models,
// chunked, head-major and token-major, two rooms per session, and with a
// CP group of two prefill ranks reported as one.
func TestTinyTokensAcrossTheSession(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      func() generate.Config
		requests int
	}{
		{"gqa", func() generate.Config { return quickTiny("tiny-gqa") }, 2},
		{"mla token-major", func() generate.Config {
			c := quickTiny("tiny-mla")
			c.PageOrder = reshard.TokenMajor
			return c
		}, 1},
		{"gqa cp 2", func() generate.Config {
			c := quickTiny("tiny-gqa")
			c.CP = 2
			return c
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runTiny(t, tc.cfg(), tc.requests)
			var b strings.Builder
			r.rep.Text(&b, "loopback")
			require.NoError(t, r.byeErr, b.String())
			require.True(t, r.rep.TokensEqual, b.String())
			assert.Equal(t, 3*tc.requests, r.rep.Chunks)
			assert.Zero(t, r.rep.FailedChunks)
			assert.True(t, r.sum.Complete(), "%s", r.sum)
			require.NotNil(t, r.sum.Tokens)
			assert.Equal(t, tc.requests, r.sum.Tokens.Rooms)
			assert.Equal(t, tc.requests, r.sum.Tokens.Equal)
			assert.Contains(t, r.sum.String(), "tokens_equal: true")
			assert.NotContains(t, r.sum.String(), "pages verified", "a tiny model's bytes are not checked against a pattern")
			require.Len(t, r.rooms, tc.requests)
			m, err := tinylm.New(tc.cfg().Model)
			require.NoError(t, err)
			for i, rc := range r.rooms {
				// The model's tokens, computed here on its own.
				spec := generate.Spec{Seed: tc.cfg().Seed, PromptTokens: tc.cfg().PromptTokens}
				first, want, err := m.Reference(spec.RoomPrompt(m, uint64(i+1)), tc.cfg().NewTokens)
				require.NoError(t, err)
				assert.Equal(t, uint64(i+1), rc.Room)
				assert.True(t, rc.OK(), "%s", rc)
				assert.Equal(t, want.Tokens(), rc.Tokens)
				assert.Equal(t, first.Token, rc.First)
				assert.Zero(t, rc.MaxLogitDiff, "the same arithmetic as the model's, chunked or not")
				assert.Greater(t, rc.MinMargin, 10*tinylm.LogitTolerance)
				assert.Equal(t, first.Token, r.rep.Rooms[i].FirstToken, "the prefill's pick")
				assert.Contains(t, rc.String(), "tokens_equal: true")
			}
		})
	}
}

// TestTinyPlantedBugsFailTheRoom: a prefill that commits a production bug
// gets its rooms failed by the decode side. A RoPE offset and the hookless
// layer left unsent move every byte the engine was given faithfully: only
// the tokens the decode side decodes catch them. The chunk-position bug is
// caught by the decode core before any token is decoded (chunk 1 reports
// chunk 0's range again): it fails the room, and refuses the later chunks
// of the room that ended, so no room is left to check.
func TestTinyPlantedBugsFailTheRoom(t *testing.T) {
	for _, tc := range []struct {
		model     string
		plant     generate.Plant
		want      string // in the prefill's report
		unchecked string // why the decode side could not decode the room, if it could not
	}{
		{"tiny-gqa", generate.PlantRoPEOffset, "tokens_equal: false: the decode from the transferred KV differs from the model", ""},
		{"tiny-mla", generate.PlantHooklessNotSent, "tokens_equal: false: the decode from the transferred KV differs from the model", ""},
		{"tiny-gqa", generate.PlantChunkPositions, "room 1 chunk [0, 16) rank 0: reported twice", "the core"},
	} {
		t.Run(tc.plant.String(), func(t *testing.T) {
			cfg := quickTiny(tc.model)
			cfg.Plant = tc.plant
			r := runTiny(t, cfg, 1)
			var b strings.Builder
			r.rep.Text(&b, "loopback")
			assert.False(t, r.rep.TokensEqual, b.String())
			assert.Contains(t, b.String(), tc.want)
			assert.True(t, errors.Is(r.byeErr, decode.ErrChunkFailed), "%v", r.byeErr)
			assert.False(t, r.sum.Complete(), "%s", r.sum)
			assert.Zero(t, r.sum.Rooms, "a room whose tokens differ is never complete")
			if tc.unchecked == "the core" {
				assert.Empty(t, r.rooms, "failed by the core, never decoded")
				return
			}
			require.Len(t, r.rooms, 1)
			rc := r.rooms[0]
			assert.False(t, rc.OK())
			assert.Contains(t, rc.String(), "tokens_equal: false")
			assert.Contains(t, r.sum.String(), "tokens_equal: false")
			assert.Equal(t, 0, r.sum.Tokens.Equal)
			if tc.unchecked != "" {
				require.Error(t, rc.Err)
				assert.Contains(t, rc.Err.Error(), tc.unchecked)
				return
			}
			assert.NoError(t, rc.Err, "the room was checked")
			assert.False(t, rc.Equal, "%s", rc)
			assert.Contains(t, rc.String(), "step ")
		})
	}
}

func TestParseTiny(t *testing.T) {
	good := generate.Spec{Model: "tiny-mla", Seed: 1<<64 - 1, Requests: 3, PromptTokens: 100, NewTokens: 8, PageSize: 16, Order: reshard.TokenMajor}
	s, err := ParseTiny(FormatTiny(good))
	require.NoError(t, err)
	assert.Equal(t, good, s)
	text := FormatTiny(good)
	for _, tc := range []struct{ text, want string }{
		{strings.Replace(text, "tiny-mla", "llama70b", 1), `model "llama70b": want one of tiny-gqa, tiny-mla`},
		{strings.Replace(text, "requests=3", "requests=65", 1), "requests 65: must be within [1, 64]"},
		{strings.Replace(text, "prompt-tokens=100", "prompt-tokens=4096", 1), "prompt-tokens 4096: must be within [1, 2048]"},
		{strings.Replace(text, "new-tokens=8", "new-tokens=0", 1), "new-tokens 0: must be within [1, 256]"},
		{strings.Replace(text, "page-size=16", "page-size=200", 1), "page-size 200: must be within [1, 108]"},
		{strings.Replace(text, "page-size=16", "page-size=-1", 1), `page-size "-1": want a number`},
		{strings.Replace(text, "page-size=16", "page-size=99999999999", 1), `page-size "99999999999": want a number`},
		{strings.Replace(text, "token-major", "diagonal", 1), `page-order "diagonal": want head-major or token-major`},
		{strings.Replace(text, "seed=18446744073709551615", "seed=x", 1), `seed "x": want a number`},
		{strings.Replace(text, " requests=3", "", 1), "missing requests"},
		{text + " requests=3", `field "requests" given twice`},
		{text + " color=red", `unknown field "color"`},
		{text + " junk", `field "junk" is not name=value`},
		{text + strings.Repeat(" ", 600), "longer than 512 bytes"},
	} {
		_, err := ParseTiny(tc.text)
		require.Error(t, err, tc.text)
		assert.Contains(t, err.Error(), tc.want)
		assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	}
}

// TestTinyHelloRefused: a spec the decode process would not check is
// refused at Hello, naming the field, before any pool is sized.
func TestTinyHelloRefused(t *testing.T) {
	decTr, preTr, node := loopbackPair(t)
	d, err := StartDecode(node, decTr, 64<<20, nil, nil)
	require.NoError(t, err)
	defer d.Close(context.Background())
	cfg := quickTiny("tiny-gqa")
	p := NewTinyPrefill(node, decode.DialConfig{Decode: d.Server.Addr(), PageSize: cfg.PageSize}, preTr, nil)
	_, err = generate.RunRemote(context.Background(), func() generate.Config { c := cfg; c.PromptTokens = 4096; return c }(), 1, p, true, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "a decode process checks at most 2048")
	// The prefill checks its own bounds first; a forged Hello is the
	// decode's to refuse.
	side := cfg.Model.Side(1, nil, cfg.PageSize, reshard.HeadMajor)
	_, _, err = p.Open(context.Background(), testbed.KV(side.Layers, side.ItemLen(), 64), generate.Spec{Model: "tiny-gqa", Seed: 1, Requests: 1, PromptTokens: 42, NewTokens: 999, PageSize: 4})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "new-tokens 999: must be within [1, 256]")
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	st, err := d.Server.State()
	require.NoError(t, err)
	assert.Zero(t, st.Sessions)
}

// TestTinyRoomsForgottenWithTheirSession: a room whose session ends before
// its last chunk (the prefill stopped early) leaves nothing behind in the
// token checks, even while another session keeps the pool; its expected
// tokens, computed off the control plane, are waited for at Close.
func TestTinyRoomsForgottenWithTheirSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	decTr, preTr, node := loopbackPair(t)
	d, err := StartDecode(node, decTr, 64<<20, nil, nil)
	require.NoError(t, err)
	inFlight := make(chan int, 2) // the rooms in flight as each session ended
	served := make(chan DecodeSummary, 1)
	go func() {
		served <- d.Serve(ctx, ServeConfig{Runs: 1, DrainTimeout: 30 * time.Second, OnSession: func(SessionEnd) {
			d.tiny.mu.Lock()
			inFlight <- len(d.tiny.rooms)
			d.tiny.mu.Unlock()
		}})
	}()
	cfg := quickTiny("tiny-gqa")
	side := cfg.Model.Side(1, nil, cfg.PageSize, reshard.HeadMajor)
	geom := testbed.KV(side.Layers, side.ItemLen(), 64)
	spec := generate.Spec{Model: "tiny-gqa", Seed: 3, Requests: 1, PromptTokens: 42, NewTokens: 6, PageSize: 4, Order: reshard.HeadMajor}
	open := func(name string) (*TinyPrefill, system.Peer) {
		p := NewTinyPrefill(node, decode.DialConfig{Decode: d.Server.Addr(), PageSize: cfg.PageSize, Name: name}, preTr, nil)
		_, peer, err := p.Open(context.Background(), geom, spec)
		require.NoError(t, err)
		return p, peer
	}
	first, peer := open("first")
	other, _ := open("other") // holds the pool
	chunk := system.ChunkSpec{Room: 1, Start: 0, End: 16, SrcPages: []int{0, 1, 2, 3}, TotalPages: 11,
		Infos: []system.DecodeInfo{{Peer: peer.ID, DstPages: []int{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}}}
	res := system.Result{Status: system.Succeeded}
	res.Chunk.Room, res.Chunk.Start, res.Chunk.End = 1, 0, 16
	require.NoError(t, first.Notify(chunk, res), "a first chunk is only recorded")
	d.tiny.mu.Lock()
	assert.Len(t, d.tiny.rooms, 1)
	d.tiny.mu.Unlock()
	_, err = first.End(ctx, errors.New("stopped after chunk 0"))
	require.True(t, errors.Is(err, decode.ErrSessionAborted), "%v", err)
	assert.Zero(t, <-inFlight, "the session's room is forgotten with it")
	_, err = other.End(ctx, nil)
	require.NoError(t, err, "an empty session")
	s := <-served
	assert.Nil(t, s.Tokens, "no room was checked")
	require.NoError(t, d.Close(context.Background()))
}

// TestTinyToShardedDecodeRefused: a decode process started with sharding
// flags refuses a tiny model's prefill, saying how to start it.
func TestTinyToShardedDecodeRefused(t *testing.T) {
	decTr, preTr, node := loopbackPair(t)
	d, err := StartShardedDecode(node, decTr, workload.Shard{Model: "llama70b", PrefillTP: 2, DecodeTP: 2}, 64<<20, nil, nil)
	require.NoError(t, err)
	defer d.Close(context.Background())
	cfg := quickTiny("tiny-gqa")
	p := NewTinyPrefill(node, decode.DialConfig{Decode: node.Addr(), PageSize: cfg.PageSize}, preTr, nil)
	_, err = generate.RunRemote(context.Background(), cfg, 1, p, true, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the prefill runs a tiny model, which runs unsharded across processes; this decode process serves --model llama70b")
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
}
