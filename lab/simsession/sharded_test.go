package simsession

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// shardedCfg is a small sharded run of model: 2 requests of 300 tokens in
// 16-token pages (19 pages each), layers hook layers.
func shardedCfg(model string, layers, preTP, prePP, decTP, decPP int, order reshard.Order) workload.Config {
	cfg := workload.Defaults()
	cfg.Preset, cfg.Layers, cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize, cfg.GroupSize =
		workload.Presets[model], layers, 2, 300, 256, 16, 2
	cfg.PrefillTP, cfg.PrefillPP, cfg.DecodeTP, cfg.DecodePP, cfg.PageOrder = preTP, prePP, decTP, decPP, order
	return cfg
}

func withRequests(cfg workload.Config, requests, resident int) workload.Config {
	cfg.Requests, cfg.Resident = requests, resident
	return cfg
}

// flagsOf is what the decode process is started with for cfg.
func flagsOf(cfg workload.Config) workload.Shard {
	return workload.Shard{Model: cfg.Preset.Name, PrefillTP: cfg.PrefillTP, PrefillPP: cfg.PrefillPP,
		DecodeTP: cfg.DecodeTP, DecodePP: cfg.DecodePP, Order: cfg.PageOrder}
}

// shardedRig is a sharded decode side started with some flags, serving on
// one node and one loopback fabric (what `kvstream decode` does over UCX),
// and the prefills run into it in turn (what `kvstream prefill` does).
type shardedRig struct {
	ctx   context.Context
	node  *decode.Node
	preTr *loopback.Transport
	out   chan served
	logs  *observer.ObservedLogs
}

type served struct {
	s   DecodeSummary
	err error
}

func newShardedRig(t *testing.T, flags workload.Shard) *shardedRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	decTr, preTr, node := loopbackPair(t)
	core, logs := observer.New(zap.WarnLevel)
	d, err := StartShardedDecode(node, decTr, flags, 64<<20, nil, zap.New(core))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	r := &shardedRig{ctx: ctx, node: node, preTr: preTr, out: make(chan served, 1), logs: logs}
	go func() { r.out <- served{s: d.Serve(ctx, oneRun)} }()
	return r
}

// prefill runs cfg's prefill ranks into the decode side and says goodbye.
func (r *shardedRig) prefill(cfg workload.Config) (mr *workload.ModeReport, runErr, byeErr error) {
	p := NewPrefill(r.node, decode.DialConfig{Decode: r.node.Addr(), PageSize: cfg.PageSize}, r.preTr, cfg.PromptTokens)
	mr, runErr = workload.RunRemote(r.ctx, cfg, nil, p, true)
	if len(p.sessions()) > 0 {
		_, byeErr = p.End(r.ctx, runErr)
	}
	return mr, runErr, byeErr
}

// runSharded runs cfg into a decode side started with flags and returns
// both sides' outcomes; the decode side's Serve error, if any.
func runSharded(t *testing.T, cfg workload.Config, flags workload.Shard) (DecodeSummary, error, *workload.ModeReport, error, error) {
	t.Helper()
	r := newShardedRig(t, flags)
	mr, runErr, byeErr := r.prefill(cfg)
	s := <-r.out
	return s.s, s.err, mr, runErr, byeErr
}

// TestShardedSessionsVerified: every prefill (stage, rank) engine streams
// into every decode (stage, rank) pool of another "process", each a
// session of its own; each decode rank checks every page of every chunk
// against the whole-tensor pattern of the heads and layers it holds, and
// every session is complete. GQA with TP growing (each decode rank a half
// of a prefill rank's heads), and MLA with PP stages that cut the layers
// differently on each side.
func TestShardedSessionsVerified(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    workload.Config
		ranks  int
		pages  uint64 // buffer pages verified, every rank together
		chunks int    // of the schedule, each told to every decode rank
	}{
		// 4 decode ranks x 2 requests x 19 pages x (4 layers x K, V); 4
		// chunks (request 0: 256 + 44 tokens, request 1: 208 + 92).
		{"llama70b-tp2-to-tp4", shardedCfg("llama70b", 4, 2, 0, 4, 0, reshard.HeadMajor), 4, 4 * 2 * 19 * 8, 4},
		// 3 decode stages holding 5 layers (4 + the MTP layer) between them.
		{"dsv3-tp2pp2-to-pp3", shardedCfg("dsv3", 4, 2, 2, 1, 3, reshard.TokenMajor), 3, 2 * 19 * 5, 4},
		// 5 requests through 2 resident slots: a request's decode pages
		// are another's once it finished, and each is checked as it lands.
		{"llama70b-resident-2-of-5", withRequests(shardedCfg("llama70b", 4, 2, 0, 4, 0, reshard.HeadMajor), 5, 2), 4, 4 * 5 * 19 * 8, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, serveErr, mr, err, byeErr := runSharded(t, tc.cfg, flagsOf(tc.cfg))
			require.NoError(t, err)
			require.NoError(t, serveErr)
			require.NoError(t, byeErr)
			assert.Zero(t, mr.Failed)
			assert.Empty(t, mr.Aborted)
			assert.True(t, s.Complete(), "%s", s)
			assert.Equal(t, tc.ranks, s.Ranks)
			assert.Equal(t, tc.pages, s.VerifiedPages)
			assert.Equal(t, tc.ranks*tc.chunks, s.Chunks)
			assert.Positive(t, mr.SubmitsPerForward)
			assert.Positive(t, mr.BlocksPerForward)
		})
	}
}

// TestShardedPairingMustAgree: a prefill and a decode process that differ
// on the pairing stop before anything is sized or sent: the prefill fails
// and the decode side logs, both saying which flag differs and its two
// values; so do a sharded prefill and a decode process started without
// sharding, and the other way round. The decode process keeps serving: the
// prefill restarted with its flags completes, byte-equal.
func TestShardedPairingMustAgree(t *testing.T) {
	good := shardedCfg("llama70b", 4, 2, 0, 2, 0, reshard.HeadMajor)
	for _, tc := range []struct {
		name string
		bad  workload.Config
		want string
	}{
		{"decode TP", shardedCfg("llama70b", 4, 2, 0, 4, 0, reshard.HeadMajor), "the prefill runs --decode-tp 4, this decode process --decode-tp 2"},
		{"model", shardedCfg("dsv3", 4, 2, 0, 2, 0, reshard.HeadMajor), "the prefill runs --model dsv3, this decode process --model llama70b"},
		{"unsharded prefill", shardedCfg("llama70b", 4, 0, 0, 0, 0, reshard.HeadMajor),
			"the prefill does not shard; this decode process serves --model llama70b --prefill-tp 2 --prefill-pp 1 --decode-tp 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newShardedRig(t, flagsOf(good))
			_, err, _ := r.prefill(tc.bad)
			require.Error(t, err)
			assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
			assert.ErrorContains(t, err, tc.want)
			refused := r.logs.FilterMessage("hello refused").FilterField(zap.String("reason", "admit")).All()
			require.NotEmpty(t, refused, "the decode side logs the refusal")
			assert.Contains(t, refused[0].ContextMap()["error"], tc.want)

			mr, err, byeErr := r.prefill(good)
			require.NoError(t, err, "the decode process still serves")
			require.NoError(t, byeErr)
			assert.Zero(t, mr.Failed)
			s := <-r.out
			require.NoError(t, s.err)
			assert.True(t, s.s.Complete(), "%s", s.s)
		})
	}
}

// TestShardingOnOneSideOnly: an unsharded decode process refuses a
// sharded prefill, naming what the prefill runs, and keeps serving.
func TestShardingOnOneSideOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	decTr, preTr, node := loopbackPair(t)
	core, logs := observer.New(zap.WarnLevel)
	d, err := StartDecode(node, decTr, 64<<20, nil, zap.New(core))
	require.NoError(t, err)
	defer d.Close(context.Background())
	served := make(chan DecodeSummary, 1)
	go func() { served <- d.Serve(ctx, oneRun) }()
	cfg := shardedCfg("llama70b", 4, 2, 0, 1, 0, reshard.HeadMajor)
	p := NewPrefill(node, decode.DialConfig{Decode: node.Addr(), PageSize: cfg.PageSize}, preTr, cfg.PromptTokens)
	_, err = workload.RunRemote(ctx, cfg, nil, p, true)
	assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "this decode process was started without --prefill-tp/--decode-tp")
	refused := logs.FilterMessage("hello refused").FilterField(zap.String("reason", "admit")).All()
	require.NotEmpty(t, refused, "the decode side logs the refusal")
	assert.Contains(t, refused[0].ContextMap()["error"], "the prefill shards (model=llama70b layers=4 prefill-tp=2")

	cfg = shardedCfg("llama70b", 4, 0, 0, 0, 0, reshard.HeadMajor)
	p = NewPrefill(node, decode.DialConfig{Decode: node.Addr(), PageSize: cfg.PageSize}, preTr, cfg.PromptTokens)
	mr, err := workload.RunRemote(ctx, cfg, nil, p, true)
	require.NoError(t, err, "the decode process still serves")
	assert.Zero(t, mr.Failed)
	_, err = p.End(ctx, nil)
	require.NoError(t, err)
	assert.True(t, (<-served).Complete())
}

// TestRankCheckNamesTheWrongPage: a decode rank's check accepts exactly
// the pattern of its own heads of each buffer's layer, and names the
// rank, room, position, page and buffer of the first page that holds
// anything else (a neighbour's head slice, another layer's heads).
func TestRankCheckNamesTheWrongPage(t *testing.T) {
	_, dec, err := workload.Shard{Model: "llama70b", Layers: 4, PrefillTP: 2, DecodeTP: 4, DecodePP: 2, PageSize: 16, Scale: 8}.Sides()
	require.NoError(t, err)
	r := &decodeRank{rank: reshard.Rank{TP: 1, Stage: 1}, admitted: &dec}
	bufs, err := r.size(layoutOf(workload.RankGeometry(&dec, 1, 8)), 1<<20)
	require.NoError(t, err)
	defer r.pool.Free()
	require.Len(t, bufs, 4) // layers 2 and 3, K and V
	const seed, room = 7, 3
	c := decode.Chunk{Room: room, Positions: []int{5, 6}, DstPages: []int{2, 7}}
	fill := func(tp, layerShift int) {
		for i, pos := range c.Positions {
			for b := range bufs {
				layer, kind := workload.LayerKind(&dec, 1, b)
				workload.PageFill(r.pool.Page(b, c.DstPages[i]), &dec, tp, seed, room, layer+layerShift, kind, pos)
			}
		}
	}
	fill(1, 0)
	require.NoError(t, r.check(seed, c))
	assert.Equal(t, uint64(2*4), r.verified)

	fill(2, 0) // rank 2's heads: the next slice of the same layers
	assert.EqualError(t, r.check(seed, c), "decode TP rank 1 (PP stage 1) room 3 position 5 (decode page 2) buffer K0: bytes differ from the rank's heads")
	fill(1, -2) // stage 0's layers: as if PP stages were ignored
	assert.ErrorContains(t, r.check(seed, c), "decode TP rank 1 (PP stage 1) room 3 position 5")
	assert.NotEmpty(t, r.mismatch)
}

func layoutOf(g testbed.Geometry) []decode.PrefillBuffer {
	out := make([]decode.PrefillBuffer, g.Buffers())
	for i := range out {
		out[i] = decode.PrefillBuffer{Name: g.Names[i], Layer: g.Layers[i], ItemLen: g.ItemLen, Pages: uint64(g.Pages)}
	}
	return out
}

// TestShardedRunEndsWithAFailedSession: a prefill that opened every
// rank's session and stopped early is a run that ended (not complete), so
// a bounded decode process stops at once, not at its deadline; one that
// serves until told goes on.
func TestShardedRunEndsWithAFailedSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	decTr, _, node := loopbackPair(t)
	pairing := workload.Shard{Model: "llama70b", Layers: 4, PrefillTP: 2, DecodeTP: 2, PageSize: 16, Scale: 8}
	d, err := StartShardedDecode(node, decTr, workload.Shard{Model: "llama70b", PrefillTP: 2, DecodeTP: 2}, 64<<20, nil, nil)
	require.NoError(t, err)
	defer d.Close(context.Background())
	served := make(chan DecodeSummary, 1)
	go func() { served <- d.Serve(ctx, oneRun) }()

	_, dec, err := pairing.Sides()
	require.NoError(t, err)
	p := NewPrefill(node, decode.DialConfig{Decode: node.Addr(), PageSize: 16}, decTr, 64)
	ranks := []workload.DecodeRank{{Geometry: workload.RankGeometry(&dec, 0, 8)}, {Rank: reshard.Rank{TP: 1}, Geometry: workload.RankGeometry(&dec, 0, 8)}}
	_, _, err = p.OpenSharded(context.Background(), pairing, ranks, 1, nil)
	require.NoError(t, err)
	// One chunk that failed, then the prefill stops early.
	p.ChunkDone(workload.Notice{Room: 1, Start: 0, End: 16, Status: system.Failed, Err: errors.New("timeout"), Positions: []int{0}, DstPages: []int{0}})
	_, err = p.End(ctx, errors.New("stopped before forward 1"))
	assert.True(t, errors.Is(err, decode.ErrSessionAborted), "%v", err)
	s := <-served
	require.NoError(t, ctx.Err(), "the run's end ends the serving, not ctx's deadline")
	assert.False(t, s.Complete())
	assert.Equal(t, 2, s.Sessions, "%s", s)
	assert.Equal(t, 2, s.Outcomes["failed"], "%s", s)
	assert.True(t, errors.Is(s.Err, decode.ErrChunkFailed), "%v", s.Err)
}
