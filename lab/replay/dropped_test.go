package replay

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cut is tr as a ring that overwrote its first k records writes it.
func cut(tr *trace.Trace, k int) *trace.Trace {
	out := &trace.Trace{Header: tr.Header, Records: tr.Records[k:]}
	out.Header.Dropped = tr.Header.Dropped + uint64(k)
	out.Header.Records = len(out.Records)
	return out
}

func scenarioNames(t *testing.T) []string {
	t.Helper()
	fs, err := filepath.Glob(filepath.Join("..", "..", "tests", "testdata", "traces", "*.jsonl"))
	require.NoError(t, err)
	require.NotEmpty(t, fs)
	var names []string
	for _, f := range fs {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".jsonl"))
	}
	return names
}

// TestDroppedRingReplays: a trace whose ring overwrote its first k records,
// for every scenario trace and every k, replays without divergence: the
// records about actors, rooms, chunks, peers and forwards whose beginning
// was dropped are skipped, and what is whole replays.
func TestDroppedRingReplays(t *testing.T) {
	for _, name := range scenarioNames(t) {
		tr := scenarioTrace(t, name)
		for k := 0; k <= len(tr.Records); k++ {
			out, err := Cores(cut(tr, k).Stream())
			require.NoError(t, err, "%s cut %d", name, k)
			if !assert.Nil(t, out.Divergence, "%s cut %d: %v", name, k, out.Divergence) {
				break
			}
			assert.Equal(t, len(tr.Records)-k, out.Records)
		}
	}
}

// TestDroppedRingEngineReplays: the engine replay of a trace whose ring
// dropped records re-issues the calls of the rooms the trace holds whole
// and compares their statuses and bytes; the others' are passed over.
func TestDroppedRingEngineReplays(t *testing.T) {
	for _, name := range []string{"timeout", "chunked_fifo_late_chunk", "two_info_fallback"} {
		tr := scenarioTrace(t, name)
		for _, k := range []int{1, 3, len(tr.Records) / 2} {
			out, err := Engine(context.Background(), opener(cut(tr, k)))
			require.NoError(t, err, "%s cut %d", name, k)
			assert.Empty(t, out.Mismatch, "%s cut %d: recorded %v, replayed %v", name, k, out.Recorded, out.Replayed)
		}
		// Shifted (the dropped records were about nothing it holds): the
		// rooms are whole and replay in full.
		sh := cut(tr, 0)
		sh.Header.Dropped = 5
		for i := range sh.Records {
			sh.Records[i].Seq += 5
		}
		out, err := Engine(context.Background(), opener(sh))
		require.NoError(t, err)
		assert.Empty(t, out.Mismatch)
		assert.Positive(t, out.Chunks, name)
	}
}
