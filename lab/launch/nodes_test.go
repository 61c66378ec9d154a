package launch

import (
	"context"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/metricsdoc"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nodeRig is a decode instance and a prefill rank in this process: one
// control-plane node (a process has one), the loopback fabric, the
// in-process membership.
type nodeRig struct {
	node          *decode.Node
	fab           *loopback.Fabric
	local         *cluster.Local
	decOps, rkOps *service.Ops
}

func newNodeRig(t *testing.T) *nodeRig {
	t.Helper()
	node, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close(context.Background()) })
	r := &nodeRig{node: node, fab: loopback.NewFabric(loopback.Options{}), local: cluster.NewLocal()}
	t.Cleanup(func() { _ = r.local.Close() })
	r.decOps, err = service.Start(service.Config{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.decOps.Close(context.Background()) })
	r.rkOps, err = service.Start(service.Config{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.rkOps.Close(context.Background()) })
	return r
}

func smallWorkload() workload.Config {
	cfg := workload.Defaults()
	cfg.Preset, cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize, cfg.GroupSize = workload.Presets["small"], 2, 500, 128, 16, 4
	cfg.CP = cp.CP{Size: 1}
	return cfg
}

// events reads a node's event lines into a channel.
func events(t *testing.T) (io.Writer, <-chan Event) {
	t.Helper()
	r, w := io.Pipe()
	ch := make(chan Event, 1024)
	go func() {
		defer close(ch)
		_ = ReadEvents(r, func(e Event) { ch <- e }, nil)
	}()
	t.Cleanup(func() { _ = w.Close() })
	return w, ch
}

func waitEvent(t *testing.T, ch <-chan Event, kind string) Event {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case e, ok := <-ch:
			require.True(t, ok, "events ended before %q", kind)
			if e.Event == kind {
				return e
			}
			if e.Event == EventBatch && !e.OK && kind != EventBatch {
				t.Fatalf("waiting for %q: batch %d failed: %s", kind, e.Batch, e.Error)
			}
		case <-timeout:
			t.Fatalf("no %q event within a minute", kind)
		}
	}
}

func httpGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestNodesServeAndDrain: a decode instance and a prefill rank found
// through discovery run batches byte-equal, over one session, asking
// discovery once (the rank's watch), whatever the batches, requests and
// forwards; both are ready while they serve; the rank's stdin closing
// drains it (nothing in flight lost: it says goodbye), then the decode
// instance's SIGTERM drains it (its session already ended: nothing cut).
// The metrics count what happened, from 0.
func TestNodesServeAndDrain(t *testing.T) {
	r := newNodeRig(t)
	decTr, err := r.fab.NewTransport("decode-0")
	require.NoError(t, err)
	defer decTr.Close()
	rkTr, err := r.fab.NewTransport("g0-r0")
	require.NoError(t, err)
	defer rkTr.Close()

	decOut, decEv := events(t)
	decAccept, decDrain := context.WithCancelCause(context.Background())
	decDone := make(chan error, 1)
	go func() {
		decDone <- RunDecodeInstance(decAccept, context.Background(), DecodeInstanceConfig{ID: "decode-0", Node: r.node, Transport: decTr,
			Provider: r.local, Group: decode.Group{Size: 1, PageSize: 16}, MaxPoolBytes: 64 << 20, Ops: r.decOps, Out: decOut, DrainTimeout: 20 * time.Second})
	}()
	ready := waitEvent(t, decEv, EventReady)
	assert.Equal(t, r.node.Addr(), ready.Addr)
	assert.Equal(t, r.decOps.Addr(), ready.Metrics)
	code, _ := httpGet(t, r.decOps.Addr(), "/readyz")
	assert.Equal(t, http.StatusOK, code)
	_, body := httpGet(t, r.decOps.Addr(), "/metrics")
	assert.Contains(t, body, `kvstream_node_rooms_total{outcome="failed"} 0`, "every outcome from the start")
	assert.Contains(t, body, `kvstream_node_rooms_total{outcome="complete"} 0`)

	rkOut, rkEv := events(t)
	cmds := make(chan string)
	rkDone := make(chan error, 1)
	go func() {
		rkDone <- RunPrefillRank(context.Background(), context.Background(), PrefillRankConfig{Workload: smallWorkload(), Group: "g0",
			Node: r.node, Transport: rkTr, Provider: r.local, Commands: cmds, Ops: r.rkOps, Out: rkOut, DrainTimeout: 20 * time.Second})
	}()
	waitEvent(t, rkEv, EventReady)
	const batches = 3
	for b := range batches {
		cmds <- Command{Batch: b, Decode: "decode-0"}.String()
		e := waitEvent(t, rkEv, EventBatch)
		assert.True(t, e.OK, "batch %d: %s", b, e.Error)
	}
	for range batches * 2 {
		e := waitEvent(t, decEv, EventRoom)
		assert.True(t, e.Complete, "%+v", e)
	}
	_, body = httpGet(t, r.rkOps.Addr(), "/metrics")
	assert.Contains(t, body, `kvstream_node_batches_total{outcome="ok"} 3`)
	assert.Contains(t, body, `kvstream_node_batches_total{outcome="failed"} 0`)
	assert.Contains(t, body, "kvstream_node_registered 1")
	assert.Contains(t, body, `kvstream_chunks_total{status="success"}`, "the rank's engines export their metrics")

	close(cmds) // the supervisor closed the rank's stdin
	drain := waitEvent(t, rkEv, EventDrain)
	assert.Contains(t, drain.Drain, "drain (stdin closed): 0 in flight at the start, 0 left")
	row := waitEvent(t, rkEv, EventNode).Row
	require.NotNil(t, row)
	assert.Equal(t, batches, row.Batches)
	assert.Zero(t, row.FailedChunks)
	assert.True(t, row.Drained)
	assert.Equal(t, int64(1), row.Sessions, "one session for every batch")
	assert.Equal(t, int64(1), row.Lookups, "one watch; nothing per batch, request or forward")
	require.NoError(t, <-rkDone)

	decDrain(errorString("terminated"))
	drain = waitEvent(t, decEv, EventDrain)
	assert.Contains(t, drain.Drain, "drain (terminated): ")
	assert.Contains(t, drain.Drain, " 0 left")
	row = waitEvent(t, decEv, EventNode).Row
	require.NotNil(t, row)
	assert.Equal(t, batches*2, row.RoomsComplete)
	assert.Empty(t, row.Mismatch)
	assert.Equal(t, uint64(batches*2*32*9), row.PagesVerified)
	assert.True(t, row.Drained)
	require.NoError(t, <-decDone)
	_, body = httpGet(t, r.decOps.Addr(), "/metrics")
	assert.Contains(t, body, `kvstream_node_rooms_total{outcome="complete"} 6`)
	assert.Contains(t, body, "kvstream_node_pages_verified_total 1728")
	assert.Contains(t, body, "kvstream_node_registered 0", "deregistered by the drain")
	code, body = httpGet(t, r.decOps.Addr(), "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "[-]draining")

	// docs/OBSERVABILITY.md lists exactly what the three processes serve.
	upOps, err := service.Start(service.Config{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer upOps.Close(context.Background())
	_, err = newUpMetrics(upOps.Registerer())
	require.NoError(t, err)
	doc, err := metricsdoc.Doc(filepath.Join("..", "..", "docs", "OBSERVABILITY.md"), "The cluster's processes")
	require.NoError(t, err)
	served := map[string]metricsdoc.Metric{}
	for _, ops := range []*service.Ops{r.decOps, r.rkOps, upOps} {
		_, body := httpGet(t, ops.Addr(), "/metrics")
		s, err := metricsdoc.Scrape(body)
		require.NoError(t, err)
		maps.Copy(served, s)
	}
	assert.Empty(t, metricsdoc.Compare(doc, served, []string{"kvstream_up_", "kvstream_node_"}))
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestRankDrainCutsWhatOutlivesIt: a batch longer than the drain timeout
// is stopped; the drain says it lost it, and the rank's exit is an error.
func TestRankDrainCutsWhatOutlivesIt(t *testing.T) {
	r := newNodeRig(t)
	decTr, err := r.fab.NewTransport("decode-0")
	require.NoError(t, err)
	defer decTr.Close()
	rkTr, err := r.fab.NewTransport("g0-r0")
	require.NoError(t, err)
	defer rkTr.Close()
	decOut, decEv := events(t)
	decAccept, decDrain := context.WithCancel(context.Background())
	decDone := make(chan error, 1)
	go func() {
		decDone <- RunDecodeInstance(decAccept, context.Background(), DecodeInstanceConfig{ID: "decode-0", Node: r.node, Transport: decTr,
			Provider: r.local, Group: decode.Group{Size: 1, PageSize: 16}, MaxPoolBytes: 256 << 20, Out: decOut, DrainTimeout: 20 * time.Second})
	}()
	waitEvent(t, decEv, EventReady)

	cfg := smallWorkload()
	cfg.PromptTokens, cfg.LayerUsPerKTok = 4096, 20000 // forwards of about a second each
	rkOut, rkEv := events(t)
	cmds := make(chan string)
	accept, stop := context.WithCancelCause(context.Background())
	rkDone := make(chan error, 1)
	go func() {
		rkDone <- RunPrefillRank(accept, context.Background(), PrefillRankConfig{Workload: cfg, Group: "g0",
			Node: r.node, Transport: rkTr, Provider: r.local, Commands: cmds, Out: rkOut, DrainTimeout: 100 * time.Millisecond})
	}()
	waitEvent(t, rkEv, EventReady)
	cmds <- Command{Batch: 0, Decode: "decode-0"}.String()
	waitEvent(t, rkEv, EventForward)
	stop(errorString("terminated"))
	b := waitEvent(t, rkEv, EventBatch)
	assert.False(t, b.OK, "a batch cut by the drain is not reported OK")
	drain := waitEvent(t, rkEv, EventDrain)
	assert.Contains(t, drain.Drain, "drain (terminated): 1 in flight at the start, 1 left")
	assert.Contains(t, drain.Drain, "timed out")
	row := waitEvent(t, rkEv, EventNode).Row
	assert.False(t, row.Drained)
	err = <-rkDone
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "the drain lost work in flight"), "%v", err)
	decDrain()
	<-decDone
}
