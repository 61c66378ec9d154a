package replay

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scenarioTrace reads one of the commit log's scenario traces, which
// tests/trace_test.go writes and replays in full.
func scenarioTrace(t *testing.T, name string) *trace.Trace {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "tests", "testdata", "traces", name+".jsonl"))
	require.NoError(t, err)
	defer f.Close()
	tr, err := trace.Read(f)
	require.NoError(t, err)
	return tr
}

func TestEngineGeometry(t *testing.T) {
	c := trace.Config{HookLayers: 2, GroupSize: 1, PageSize: 4, CPSize: 1, CPRule: "shared", Submitters: 1,
		Buffers: []trace.Buffer{{Name: "KV0", Layer: 0, ItemLen: 16, Pages: 8}, {Name: "KV1", Layer: 1, ItemLen: 16, Pages: 12}}}
	g, err := engineGeometry(c)
	require.NoError(t, err)
	assert.Equal(t, []string{"KV0", "KV1"}, g.Names)
	assert.Equal(t, []int{0, 1}, g.Layers)
	assert.Equal(t, uint64(16), g.ItemLen)
	assert.Equal(t, 12, g.Pages, "the largest buffer's pages")

	mixed := c
	mixed.Buffers = []trace.Buffer{c.Buffers[0], {Name: "KV1", Layer: 1, ItemLen: 32, Pages: 12}}
	_, err = engineGeometry(mixed)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "buffer KV1 has 32, not 16")

	badRule := c
	badRule.CPRule = "sideways"
	_, err = engineGeometry(badRule)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "trace header")
}

// TestEngineReplaySetupDriveCompare runs the three steps of an engine
// replay one by one on a scenario with a failed chunk: the injected
// failure reproduces the recorded statuses and the bytes of the others
// match the model's.
func TestEngineReplaySetupDriveCompare(t *testing.T) {
	tr := scenarioTrace(t, "submit_failure")
	r, err := setupEngine(tr)
	require.NoError(t, err)
	defer r.close()
	require.NotEmpty(t, r.inj.failing, "the recording has a failed chunk to re-inject")
	require.NoError(t, r.drive(context.Background(), tr.Records))
	out := r.compare()
	assert.Empty(t, out.Mismatch)
	assert.Equal(t, out.Recorded, out.Replayed)
	assert.Contains(t, out.Replayed[0], "FAILED")
	assert.Positive(t, out.Chunks)
}

// TestEngineReplayErrorReleasesEverything: a record that cannot be
// re-issued fails the replay after finishes were queued, and the replay
// still closes the engine and stops its room workers (goleak checks the
// goroutines when the package's tests end).
func TestEngineReplayErrorReleasesEverything(t *testing.T) {
	tr := scenarioTrace(t, "chunked_fifo_late_chunk")
	tr.Records = append(tr.Records, trace.Record{Seq: 1 << 20, Actor: trace.Engine, ID: "engine", Type: "RegisterCall", Msg: "not a call"})
	_, err := Engine(context.Background(), tr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "record 1048576")

	noBuffers := *tr
	noBuffers.Header.Config.Buffers = nil
	_, err = Engine(context.Background(), &noBuffers)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "trace header")
}
