package simsession

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain: see decode's TestMain for the dead-letter throttle.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		// The same goroutine, as Go 1.27 names it (NewThrottle no longer inlined).
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"))
}

// loopbackPair is what two processes have over UCX, in one: a decode and a
// prefill transport on one loopback fabric, and a node for both sides'
// sessions; all closed when the test ends.
func loopbackPair(t *testing.T) (decTr, preTr *loopback.Transport, node *decode.Node) {
	t.Helper()
	fab := loopback.NewFabric(loopback.Options{})
	decTr, err := fab.NewTransport("decode")
	require.NoError(t, err)
	t.Cleanup(func() { _ = decTr.Close() })
	preTr, err = fab.NewTransport("prefill")
	require.NoError(t, err)
	t.Cleanup(func() { _ = preTr.Close() })
	node, err = decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close(context.Background()) })
	return decTr, preTr, node
}

// oneRun serves until one prefill run did something.
var oneRun = ServeConfig{Runs: 1, DrainTimeout: 30 * time.Second}

// run runs the sim workload into a decode side, both on one node and one
// loopback fabric (what `kvstream prefill` and `kvstream decode` do across
// processes over UCX), says goodbye with aborted, and returns both sides'
// outcomes. edit, if given, changes the workload.
func run(t *testing.T, aborted error, edit ...func(*workload.Config)) (DecodeSummary, *workload.ModeReport, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	decTr, preTr, node := loopbackPair(t)
	d, err := StartDecode(node, decTr, 64<<20, nil, nil)
	require.NoError(t, err)
	defer d.Close(context.Background())
	served := make(chan DecodeSummary, 1)
	go func() { served <- d.Serve(ctx, oneRun) }()

	cfg := workload.Defaults()
	cfg.Preset, cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize, cfg.GroupSize = workload.Presets["small"], 2, 500, 256, 16, 4
	for _, e := range edit {
		e(&cfg)
	}
	p := NewPrefill(node, decode.DialConfig{Decode: d.Server.Addr(), PageSize: cfg.PageSize}, preTr, cfg.PromptTokens)
	mr, err := workload.RunRemote(ctx, cfg, nil, p, true)
	require.NoError(t, err)
	require.Empty(t, mr.Aborted)
	_, byeErr := p.End(ctx, aborted)
	return <-served, mr, byeErr
}

// TestSimSessionVerified: every page of every chunk is checked on the
// decode side against the model's pattern, and the session is complete.
func TestSimSessionVerified(t *testing.T) {
	s, mr, err := run(t, nil)
	require.NoError(t, err)
	assert.Zero(t, mr.Failed)
	assert.True(t, s.Complete(), "%s", s)
	// 2 requests x 32 pages x 9 buffers of the small model.
	assert.Equal(t, uint64(2*32*9), s.VerifiedPages)
	assert.Equal(t, 4, s.Chunks)
	assert.Equal(t, 2, s.Rooms)
}

// TestSimSessionReusesPages: with more requests than resident ones, later
// rooms write the pages earlier rooms held; the decode side accepts and
// verifies every one.
func TestSimSessionReusesPages(t *testing.T) {
	s, mr, err := run(t, nil, func(c *workload.Config) { c.Requests, c.Resident = 6, 2 })
	require.NoError(t, err)
	assert.Zero(t, mr.Failed)
	assert.True(t, s.Complete(), "%s", s)
	assert.Equal(t, uint64(6*32*9), s.VerifiedPages)
	assert.Equal(t, 6, s.Rooms)
}

// TestAbortedSessionIsNotOK: a prefill that says it stopped early never
// gets a complete session on the decode side, even though every chunk it
// sent succeeded (kvstream decode exits non-zero on it).
func TestAbortedSessionIsNotOK(t *testing.T) {
	s, _, err := run(t, errors.New("stopped after forward 1"))
	assert.True(t, errors.Is(err, decode.ErrSessionAborted), "%v", err)
	assert.False(t, s.Complete(), "%s", s)
	assert.True(t, errors.Is(s.Err, decode.ErrSessionAborted), "%v", s.Err)
	assert.Contains(t, s.String(), "(1 aborted)")
	assert.Contains(t, s.String(), "first failure: the prefill stopped early: stopped after forward 1")
}
