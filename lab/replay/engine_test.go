package replay

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

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
		Buffers: []trace.BufferGeometry{{Name: "KV0", Layer: 0, ItemLen: 16, Pages: 8}, {Name: "KV1", Layer: 1, ItemLen: 16, Pages: 12}}}
	g, err := engineGeometry(c)
	require.NoError(t, err)
	assert.Equal(t, []string{"KV0", "KV1"}, g.Names)
	assert.Equal(t, []int{0, 1}, g.Layers)
	assert.Equal(t, uint64(16), g.ItemLen)
	assert.Equal(t, 12, g.Pages, "the largest buffer's pages")

	mixed := c
	mixed.Buffers = []trace.BufferGeometry{c.Buffers[0], {Name: "KV1", Layer: 1, ItemLen: 32, Pages: 12}}
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
	sv, err := surveyTrace(tr.Stream())
	require.NoError(t, err)
	r, err := setupEngine(sv)
	require.NoError(t, err)
	defer r.close()
	require.NotEmpty(t, r.inj.failing, "the recording has a failed chunk to re-inject")
	require.NoError(t, r.drive(context.Background(), tr.Stream()))
	out := r.compare()
	assert.Empty(t, out.Mismatch)
	assert.Equal(t, out.Recorded, out.Replayed)
	assert.Contains(t, out.Replayed[0], "FAILED")
	assert.Positive(t, out.Chunks)
}

// opener replays an in-memory trace.
func opener(tr *trace.Trace) func() (trace.Stream, error) {
	return func() (trace.Stream, error) { return tr.Stream(), nil }
}

// TestEngineReplayErrorReleasesEverything: a record the engine refuses
// fails the replay after finishes were queued, and the replay still closes
// the engine and stops its room workers (goleak checks the goroutines when
// the package's tests end).
func TestEngineReplayErrorReleasesEverything(t *testing.T) {
	tr := scenarioTrace(t, "chunked_fifo_late_chunk")
	tr.Records = append(tr.Records, trace.Record{Seq: 1 << 20, Actor: trace.Engine, ID: "engine", Type: "RegisterCall",
		Msg: map[string]any{"Room": 99, "End": 8, "Last": true, "SrcPages": []any{0, 1}, "TotalPages": 2,
			"Infos": []any{map[string]any{"Peer": "nobody", "DstPages": []any{0, 1}}}}})
	_, err := Engine(context.Background(), opener(tr))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "record 1048576: replayed Register")

	noBuffers := *tr
	noBuffers.Header.Config.Buffers = nil
	_, err = Engine(context.Background(), opener(&noBuffers))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "trace header: buffers 0")
}

// TestEngineReplayRefusesPoolsAboveTheBound: a header whose prefill pool,
// or a peer whose decode pool, would take more than MaxEngineBytes is
// refused before any pool is allocated, naming the record.
func TestEngineReplayRefusesPoolsAboveTheBound(t *testing.T) {
	tr := scenarioTrace(t, "partial_last_group")
	big := *tr
	big.Header.Config.Buffers = append([]trace.BufferGeometry(nil), tr.Header.Config.Buffers...)
	for i := range big.Header.Config.Buffers {
		big.Header.Config.Buffers[i].Pages = 1 << 24 // 16 Mi pages × 16 bytes × 10 buffers: 2.5 GiB
		big.Header.Config.Buffers[i].ItemLen = 32    // 5 GiB
	}
	_, err := Engine(context.Background(), opener(&big))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "engine replay: the prefill pool of the trace header (10 buffers of 16777216 pages of 32 bytes) is above the bound of 4294967296 bytes")

	hugePeer := *tr
	hugePeer.Records = append([]trace.Record{{Seq: 1 << 20, Actor: trace.Engine, ID: "engine", Type: "AddPeerCall",
		Msg: map[string]any{"ID": "d9", "ItemLen": []any{16}, "Pages": []any{1 << 24}}}}, tr.Records...)
	for i := 0; i < 2; i++ { // each peer 2.5 GiB: the second passes the bound
		hugePeer.Records = append([]trace.Record{hugePeer.Records[0]}, hugePeer.Records...)
	}
	_, err = Engine(context.Background(), opener(&hugePeer))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "record 1048576: engine replay: the decode pool of peer d9 (16777216 pages) brings the pools above the bound")
}

// TestRoomWorkersEndWhenIdle: a room's goroutine ends once its queue is
// empty (a trace naming a million rooms does not hold a million
// goroutines), and each room's calls still run in order.
func TestRoomWorkersEndWhenIdle(t *testing.T) {
	w := roomWorkers{pending: map[uint64][]func(){}}
	ran := make(chan struct{})
	w.do(1, func() { close(ran) })
	<-ran
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.pending) == 0
	}, 5*time.Second, time.Millisecond, "the idle room's goroutine ended")

	var mu sync.Mutex
	got := map[uint64][]int{}
	for i := 0; i < 1000; i++ {
		room := uint64(i % 7)
		w.do(room, func() {
			mu.Lock()
			got[room] = append(got[room], i)
			mu.Unlock()
		})
	}
	w.stop()
	assert.Empty(t, w.pending)
	for room, calls := range got {
		assert.IsIncreasing(t, calls, "room %d runs its calls in order", room)
	}
	assert.Len(t, got, 7)
}
