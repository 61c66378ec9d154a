package simsession

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestDecodeDrainWindsThePrefillDown is a rolling restart's first half in
// one process: the decode side starts draining while `kvstream prefill`
// (RunPrefillProcess) is mid-run. The prefill hears of it, starts no new
// request, finishes those started, says goodbye and returns nil; the
// decode's drain ends with the session complete, nothing cut, without
// waiting out its drain timeout (a minute here: the test would hit its own
// deadline first).
func TestDecodeDrainWindsThePrefillDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	decTr, preTr, node := loopbackPair(t)
	d, err := StartDecode(node, decTr, 64<<20, nil, nil)
	require.NoError(t, err)
	defer d.Close(context.Background())
	serving, stopServing := context.WithCancel(ctx)
	defer stopServing()
	served := make(chan DecodeSummary, 1)
	go func() { served <- d.Serve(serving, ServeConfig{DrainTimeout: time.Minute}) }()

	ops, err := service.Start(service.Config{})
	require.NoError(t, err)
	defer ops.Close(context.Background())
	cfg := workload.Defaults()
	cfg.Preset, cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize, cfg.GroupSize = workload.Presets["small"], 8, 500, 256, 16, 4
	cfg.Resident = 2
	var once sync.Once
	// The decode starts draining once the first forward is done.
	cfg.Progress = func(done, total int) { once.Do(stopServing) }
	var out, errOut bytes.Buffer
	err = RunPrefillProcess(PrefillProcessConfig{Workload: cfg, Dial: decode.DialConfig{Decode: d.Server.Addr()}, Node: node,
		Transport: preTr, TransportName: "loopback", DrainTimeout: time.Minute, Ops: ops, Out: &out, ErrOut: &errOut, Log: zap.NewNop()})
	require.NoError(t, err, "%s\n%s", out.String(), errOut.String())
	assert.Contains(t, out.String(), "decode drained: the decode server decode is draining")
	assert.Contains(t, out.String(), "bytes equal: true")

	var s DecodeSummary
	select {
	case s = <-served:
	case <-ctx.Done():
		t.Fatal("the decode's drain did not end once the prefill said goodbye")
	}
	assert.True(t, s.DrainedClean(), "%s", s)
	assert.Equal(t, 1, s.Outcomes["complete"], "%s", s)
	assert.Empty(t, s.Mismatch)
	t.Logf("prefill: %s", out.String())
}
