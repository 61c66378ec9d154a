package workload

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stopConfig is four requests of two chunks each, one chunk per forward:
// forwards 1-2 are request 0's, 3-4 request 1's, and so on.
func stopConfig(sharded bool) Config {
	cfg := Defaults()
	cfg.Preset = Presets["small"]
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens = 4, 512, 256
	cfg.PageSize = 16
	cfg.LayerUsPerKTok = 200
	cfg.Submitters = 2
	if sharded {
		cfg.Preset = Presets["llama70b"]
		cfg.Layers = 4
		cfg.PrefillTP, cfg.DecodeTP = 2, 2
	}
	return cfg
}

// runStopped runs cfg per layer in process, calling after(k) once forward
// k ended.
func runStopped(t *testing.T, ctx context.Context, cfg Config, after func(k int)) *ModeReport {
	t.Helper()
	g, p := planOf(t, cfg)
	require.Len(t, p.forwards, 8, "the schedule this test assumes")
	k := 0
	progress := func() { k++; after(k) }
	mr, err := runRig(ctx, cfg, g, p, true, nil, progress, localSide(cfg, g, p))
	require.NoError(t, err)
	return mr
}

// A drain after forward 1 starts no other request and finishes request 0,
// whose second chunk is in forward 2.
func TestDrainFinishesTheRequestsStarted(t *testing.T) {
	for _, sharded := range []bool{false, true} {
		cfg := stopConfig(sharded)
		drain := make(chan struct{})
		cfg.Drain = drain
		mr := runStopped(t, context.Background(), cfg, func(k int) {
			if k == 1 {
				close(drain)
			}
		})
		assert.Equal(t, 0, mr.Failed, mr.FirstError)
		assert.Equal(t, "drained: 3 of 4 requests not started", mr.Aborted)
		assert.Equal(t, 3, mr.NotStarted)
		assert.Equal(t, 2, mr.ForwardsDone)
		assert.Equal(t, 2, mr.ChunksDone)
		assert.Equal(t, 1, mr.RequestsDone)
		assert.Positive(t, mr.BytesMoved, "what crossed is counted")
	}
}

// An interrupt (the context ended) once forward 3 ended launches no
// forward after those enqueued, and the chunks launched finish. The
// unsharded loop runs one forward ahead (forward 4 was enqueued when
// forward 3 ended): requests 0 and 1 are done, 2 and 3 never started. The
// sharded loop waits for each forward: request 1 has one chunk of two.
func TestInterruptStopsAfterTheCurrentForward(t *testing.T) {
	for _, sharded := range []bool{false, true} {
		cfg := stopConfig(sharded)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		mr := runStopped(t, ctx, cfg, func(k int) {
			if k == 3 {
				cancel()
			}
		})
		forwards, requests := 4, 2
		if sharded {
			forwards, requests = 3, 1
		}
		assert.Equal(t, 0, mr.Failed, "the chunks launched finish: %s", mr.FirstError)
		assert.Equal(t, fmt.Sprintf("interrupted before forward %d: context canceled", forwards+1), mr.Aborted)
		assert.Equal(t, forwards, mr.ForwardsDone)
		assert.Equal(t, forwards, mr.ChunksDone)
		assert.Equal(t, requests, mr.RequestsDone)
		assert.Equal(t, 2, mr.NotStarted, "requests 2 and 3")
	}
}

// countBatches by hand: 3 MB in two batches from the first post (t0) to
// the last completion (t0 + 1 ms) is 3 GB/s, over two forwards one batch
// and 3 writes each.
func TestCountBatchesByHand(t *testing.T) {
	t0 := time.Now()
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	var m ModeReport
	window := m.countBatches([]system.Batch{
		{Bytes: 1e6, Blocks: 2, Posted: ms(0), Done: ms(0.4)},
		{Bytes: 2e6, Blocks: 4, Posted: ms(0.5), Done: ms(1)},
	}, 2)
	assert.Equal(t, time.Millisecond, window)
	assert.Equal(t, uint64(3e6), m.BytesMoved)
	assert.InDelta(t, 3.0, m.MovedGBytePerS, 1e-9)
	assert.Equal(t, 1.0, m.SubmitsPerForward)
	assert.Equal(t, 3.0, m.BlocksPerForward)
}
