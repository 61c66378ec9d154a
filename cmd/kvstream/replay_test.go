package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runReplay runs `kvstream replay ARGS` and returns what it printed.
func runReplay(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"replay"}, args...))
	err := root.Execute()
	return out.String(), err
}

// scenario reads a committed scenario trace's lines.
func scenario(t *testing.T, name string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "tests", "testdata", "traces", name+".jsonl"))
	require.NoError(t, err)
	return strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
}

func writeTrace(t *testing.T, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return path
}

// headerIndex is the header's index among a scenario file's lines (after
// its comments).
func headerIndex(t *testing.T, lines []string) int {
	t.Helper()
	for i, l := range lines {
		if strings.HasPrefix(l, "{") {
			return i
		}
	}
	t.Fatal("no header line")
	return -1
}

// TestReplayStreamsAScenario: the streamed replay of a committed trace,
// cores and engine, is what it was.
func TestReplayStreamsAScenario(t *testing.T) {
	out, err := runReplay(t, "--engine", writeTrace(t, scenario(t, "submit_failure")))
	require.NoError(t, err, out)
	assert.Contains(t, out, "no divergence")
	assert.Contains(t, out, "chunk statuses: FAILED 1")
	assert.Contains(t, out, "engine replay: same statuses, bytes equal")
}

// TestReplayRefusesAnUnboundedHeader: the header attacks (hook_layers 1e9,
// submitters 1e8) are refused naming the file, the line, the field and the
// bound, before anything is replayed.
func TestReplayRefusesAnUnboundedHeader(t *testing.T) {
	for _, c := range []struct {
		edit func(*trace.Header)
		want string
	}{
		{func(h *trace.Header) { h.Config.HookLayers = 1e9 }, "trace header: hook_layers 1000000000: above the bound of 4096"},
		{func(h *trace.Header) { h.Config.Submitters = 1e8 }, "trace header: submitters 100000000: above the bound of 1024"},
	} {
		lines := scenario(t, "partial_last_group")
		i := headerIndex(t, lines)
		var h trace.Header
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &h))
		c.edit(&h)
		b, err := json.Marshal(h)
		require.NoError(t, err)
		lines[i] = string(b)
		path := writeTrace(t, lines)
		out, err := runReplay(t, "--engine", path)
		require.Error(t, err)
		assert.Contains(t, err.Error(), path)
		assert.Contains(t, err.Error(), "trace line 5: "+c.want)
		assert.NotContains(t, out, "records:", "nothing was replayed")
	}
}

// TestReplayDivergencePrintsAnExcerpt: a divergence on a 900 KB record
// prints a few hundred bytes of it, with its length.
func TestReplayDivergencePrintsAnExcerpt(t *testing.T) {
	lines := scenario(t, "partial_last_group")
	big := strings.Repeat("z", 900<<10)
	edited := false
	for i, l := range lines {
		if strings.Contains(l, `"type":"GroupReady"`) {
			lines[i] = strings.Replace(l, `"Err":null`, `"Err":"`+big+`"`, 1)
			edited = lines[i] != l
			break
		}
	}
	require.True(t, edited, "a GroupReady record to edit")
	out, err := runReplay(t, writeTrace(t, lines))
	require.Error(t, err)
	assert.Contains(t, out, "divergence at record")
	assert.Contains(t, out, "bytes)", "the excerpt says how long the line was")
	assert.Less(t, len(out), 16<<10, "the whole record is not printed: %d bytes", len(out))
}

// TestReplayResumedChunks: a sim run whose connections broke records the
// resumes (Resend, Quiesced, the re-sent Works), and its replay decides
// them again without a divergence: the recording keeps whether a batch's
// endpoint broke (BatchDone.Broken), which the error's text alone would
// not.
func TestReplayResumedChunks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults.jsonl")
	out, err := run(t, append(quick, "--fault", "endpoint-broken:0.2", "--record", path)...)
	require.NoError(t, err, out)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"Quiesced"`, "no batch broke: the replay would check nothing")
	out, err = runReplay(t, path)
	require.NoError(t, err, out)
	assert.Contains(t, out, "no divergence")
}
