package replay

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeTrace reads one of the decode server's committed traces, which
// decode/trace_test.go writes and replays in full.
func decodeTrace(t *testing.T, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "decode", "testdata", "traces", name+".jsonl"))
	require.NoError(t, err)
	return raw
}

// TestCoresTakesADecodeTrace: the entry point kvstream replay calls
// recognises a decode server's trace by its header and replays it through
// a decode core: the same outcomes as recorded, no divergence.
func TestCoresTakesADecodeTrace(t *testing.T) {
	for _, name := range []string{"lost_prefill", "group"} {
		rd, err := trace.NewReader(bytes.NewReader(decodeTrace(t, name)))
		require.NoError(t, err)
		out, err := Cores(rd)
		require.NoError(t, err)
		require.NotNil(t, out.Decode, name)
		require.Nil(t, out.Divergence, "%s: %s", name, out)
		assert.Equal(t, out.Records, out.Replayed, name)
		text := out.String()
		assert.Contains(t, text, "decode trace, ")
		assert.Contains(t, text, "no divergence")
	}
	rd, err := trace.NewReader(bytes.NewReader(decodeTrace(t, "lost_prefill")))
	require.NoError(t, err)
	out, err := Cores(rd)
	require.NoError(t, err)
	assert.Contains(t, out.String(), "rooms ended (complete 2, failed 1, lost 1)")
}

// TestDecodeDivergencePrintsExcerpts: a decode trace's divergence prints
// like an engine's: the record, its line, both sides in bounded excerpts.
func TestDecodeDivergencePrintsExcerpts(t *testing.T) {
	tr, err := trace.Read(bytes.NewReader(decodeTrace(t, "lost_prefill")))
	require.NoError(t, err)
	i := -1
	for k, r := range tr.Records {
		if r.Type == "NoticeMsg" {
			i = k
			break
		}
	}
	require.GreaterOrEqual(t, i, 0)
	tr.Records[i].Effects = []string{"AnswerNotice " + strings.Repeat("e", 1<<20)}
	var buf bytes.Buffer
	require.NoError(t, trace.Write(&buf, tr))
	rd, err := trace.NewReader(&buf)
	require.NoError(t, err)
	out, err := Cores(rd)
	require.NoError(t, err)
	require.NotNil(t, out.Divergence)
	text := out.String()
	assert.Contains(t, text, "divergence at record "+strconv.FormatUint(tr.Records[i].Seq, 10)+" on trace line")
	assert.Contains(t, text, "(decode kvstream-decode handling NoticeMsg): the replayed core's effects differ")
	assert.Contains(t, text, "… (1048589 bytes)")
	assert.Less(t, len(text), 2*(MaxExcerptLines+2)*(MaxExcerpt+40)+1000)
}

// TestEngineRefusesADecodeTrace: the engine replay re-issues an engine's
// calls; a decode trace has none, and says which replay it takes.
func TestEngineRefusesADecodeTrace(t *testing.T) {
	raw := decodeTrace(t, "group")
	_, err := Engine(context.Background(), func() (trace.Stream, error) { return trace.NewReader(bytes.NewReader(raw)) })
	assert.ErrorContains(t, err, "a decode server's trace: its replay is the decode core's")
}

// TestDescribe: the line above a replay's outcome says what recorded the
// trace.
func TestDescribe(t *testing.T) {
	rd, err := trace.NewReader(bytes.NewReader(decodeTrace(t, "group")))
	require.NoError(t, err)
	assert.Equal(t, "kvstream 0.1.0, decode server kvstream-decode, pool sized by a Hello, CP group of 2", Describe(rd.Header()))
	rd, err = trace.NewReader(bytes.NewReader(decodeTrace(t, "lost_prefill")))
	require.NoError(t, err)
	assert.Equal(t, "kvstream 0.1.0, decode server kvstream-decode, pool 3 buffers", Describe(rd.Header()))
	tr := scenarioTrace(t, "partial_last_group")
	assert.Equal(t, "kvstream 0.1.0, 10 hook layers, group 4, 10 buffers", Describe(tr.Header))
}
