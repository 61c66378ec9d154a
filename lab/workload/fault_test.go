package workload

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFault(t *testing.T) {
	f, err := ParseFault("--fault", "endpoint-broken:0.05")
	require.NoError(t, err)
	assert.Equal(t, Fault{Kind: "endpoint-broken", Rate: 0.05}, f)
	assert.Equal(t, "endpoint-broken:0.05", f.String())
	for in, want := range map[string]string{
		"endpoint-broken":       `--fault "endpoint-broken": want KIND:RATE`,
		"flaky:0.1":             `--fault "flaky:0.1": unknown fault "flaky", want one of endpoint-broken`,
		"endpoint-broken:1.5":   `--fault "endpoint-broken:1.5": rate "1.5" must be a probability per batch within [0, 1]`,
		"endpoint-broken:-0.1":  `rate "-0.1" must be a probability`,
		"endpoint-broken:NaN":   `rate "NaN" must be a probability`,
		"endpoint-broken:often": `rate "often" must be a probability`,
	} {
		_, err := ParseFault("--fault", in)
		require.Error(t, err, in)
		assert.Contains(t, err.Error(), want)
		assert.True(t, errors.Is(err, system.ErrBadInput), in)
	}
}

// TestSimResumesBrokenEndpoints: with one batch in twenty torn by a broken
// connection, the default run completes with no chunk failed in either
// mode, every byte equal and the transport oracle satisfied (which counts
// the bytes landed against what the pages need: a torn half re-sent is
// not an excess), and the report counts the faults and the resends.
func TestSimResumesBrokenEndpoints(t *testing.T) {
	cfg := Defaults()
	cfg.Fault = Fault{Kind: "endpoint-broken", Rate: 0.05}
	cfg.Seed = 2 // three faults in the per-layer run, one in the monolithic, in every run
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err, "a chunk failed, or the run stopped")
	// The decisions depend on the seed and the batches only: this seed
	// breaks no Work past the resend limit, so no chunk may fail.
	require.Zero(t, rep.PerLayer.FaultsPastLimit)
	require.Zero(t, rep.Monolithic.FaultsPastLimit)
	assert.True(t, rep.BytesEqual, rep.Mismatch)
	assert.Empty(t, rep.OracleFailures)
	pl := rep.PerLayer
	assert.Zero(t, pl.Failed)
	assert.Zero(t, rep.Monolithic.Failed)
	require.Positive(t, pl.FaultsInjected)
	assert.GreaterOrEqual(t, pl.WorksResent, pl.FaultsInjected, "each torn batch is re-sent (and so is any batch its endpoint's close failed)")
	assert.Positive(t, pl.ChunksResumed)
}

// TestSimResumesLostCompletions: the batches whose completion the
// injector loses are written off at their completion deadline (a quarter
// of the finish timeout after Finish) and re-sent: no chunk fails and
// every byte is equal. The timeout leaves the re-send 6 s: with 2 s (1.5 s
// after the write-off) a monolithic chunk's re-sent batch missed it once
// under -race beside two busy loops and the rest of the suite.
func TestSimResumesLostCompletions(t *testing.T) {
	cfg := Defaults()
	cfg.Fault = Fault{Kind: "lost-completion", Rate: 0.05}
	cfg.FinishTimeout = 8 * time.Second
	cfg.Seed = 2
	rep, err := Run(context.Background(), cfg, nil)
	require.NoError(t, err, "a chunk failed, or the run stopped")
	require.Zero(t, rep.PerLayer.FaultsPastLimit)
	require.Zero(t, rep.Monolithic.FaultsPastLimit)
	assert.True(t, rep.BytesEqual, rep.Mismatch)
	assert.Empty(t, rep.OracleFailures)
	for _, m := range []*ModeReport{rep.PerLayer, rep.Monolithic} {
		assert.Zero(t, m.Failed)
		assert.GreaterOrEqual(t, m.WorksResent, m.FaultsInjected, "each lost completion's Work is re-sent")
	}
	require.Positive(t, rep.PerLayer.FaultsInjected+rep.Monolithic.FaultsInjected)
	assert.Positive(t, rep.PerLayer.ChunksResumed+rep.Monolithic.ChunksResumed)
}

// TestInjectorDecisionsIgnoreOrder: a fault decision depends on the seed,
// the batch's identity and how many times that identity was posted before,
// not on the order in which concurrent senders post: two injectors of one
// seed, fed the same posts in opposite orders (each identity's posts still
// in their own order), break the same posts. Another seed breaks others.
func TestInjectorDecisionsIgnoreOrder(t *testing.T) {
	var posts []rdmafault.BatchInfo
	for dst := range uint64(64) {
		for range 4 { // an identity posted again: a re-send
			posts = append(posts, rdmafault.BatchInfo{From: "p0", To: "d0", Dst: 1 << 40, DstOffset: 4096 * dst, Bytes: 512, Writes: 2})
		}
	}
	decide := func(in *injector, order []int) map[[2]uint64]bool {
		seen := map[uint64]uint64{}
		out := map[[2]uint64]bool{}
		for _, i := range order {
			b := posts[i]
			out[[2]uint64{b.DstOffset, seen[b.DstOffset]}] = in.decide(b).Kind == rdmafault.BreakEndpoint
			seen[b.DstOffset]++
		}
		return out
	}
	fwd, rev := make([]int, len(posts)), make([]int, len(posts))
	for i := range posts {
		fwd[i] = i
	}
	// Reversed by identity, each identity's posts kept in order.
	for i := range posts {
		id, k := i/4, i%4
		rev[(len(posts)/4-1-id)*4+k] = i
	}
	f := Fault{Kind: "endpoint-broken", Rate: 0.3}
	a, b := newInjector(f, 7, true), newInjector(f, 7, true)
	da, db := decide(a, fwd), decide(b, rev)
	require.Equal(t, da, db)
	require.Equal(t, a.count(), b.count())
	require.Positive(t, a.count())
	assert.NotEqual(t, da, decide(newInjector(f, 8, true), fwd), "another seed")
	assert.NotEqual(t, da, decide(newInjector(f, 7, false), fwd), "the other mode")

	// Every post broken: each identity breaks more than the resend limit
	// times in a row, and is counted once.
	all := newInjector(Fault{Kind: "endpoint-broken", Rate: 1}, 7, true)
	for range system.ResendLimit + 2 {
		all.decide(posts[0])
	}
	assert.Equal(t, 1, all.pastResendLimit())
	none := newInjector(Fault{Kind: "endpoint-broken", Rate: 0}, 7, true)
	decide(none, fwd)
	assert.Zero(t, none.count())
	assert.Zero(t, none.pastResendLimit())
}
