package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// cliMainEnv makes the test binary run as the kvstream command, so that
// tests can start real separate processes (prefill and decode).
const cliMainEnv = "KVSTREAM_TEST_CLI_MAIN"

// disconnectAfterEnv, in the environment of a test binary run as the
// command (cliMainEnv), sets kvstream decode's DisconnectAfter hook
// (seams): the test binary reads it, the production binary has no such
// variable.
const disconnectAfterEnv = "KVSTREAM_TEST_DISCONNECT_AFTER"

func TestMain(m *testing.M) {
	if os.Getenv(cliMainEnv) == "1" {
		os.Exit(execute(newRootWith(childSeams()), os.Stderr))
	}
	// protoactor's dead-letter throttle (a message for an actor that just
	// stopped, as when both ends of a session stop) ends one second later
	// on its own.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"))
}

// childSeams are the hooks the test that started this process as the
// command asked for.
func childSeams() seams {
	var s seams
	if v := os.Getenv(disconnectAfterEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "%s=%q: want a positive count of chunks\n", disconnectAfterEnv, v)
			os.Exit(2)
		}
		s.decode = func(c *simsession.DecodeProcessConfig) { c.DisconnectAfter = n }
	}
	return s
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

var quick = []string{"sim", "--model", "small", "--requests", "3", "--prompt-tokens", "1000", "--chunk-tokens", "512",
	"--page-size", "16", "--group", "4", "--layer-us-per-ktok", "400", "--no-progress"}

func TestSimJSONTraceAndPlot(t *testing.T) {
	dir := t.TempDir()
	trace, pic := filepath.Join(dir, "trace.json"), filepath.Join(dir, "timeline.png")
	out, err := run(t, append(quick, "--json", "--trace-out", trace, "--plot", pic)...)
	require.NoError(t, err, out)

	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Equal(t, true, rep["bytes_equal"])
	for _, path := range []string{"per_layer.exposed_ms", "monolithic.exposed_ms", "per_layer.ttft_ms", "monolithic.ttft_ms"} {
		parts := strings.Split(path, ".")
		mode, ok := rep[parts[0]].(map[string]any)
		require.True(t, ok, "%s missing", parts[0])
		v, ok := mode[parts[1]].(float64)
		require.True(t, ok, "%s missing or not a number", path)
		assert.Positive(t, v, path)
	}
	for _, k := range []string{"floor_ms", "submits_per_forward", "link_gbit_per_s"} {
		v, ok := rep[k].(float64)
		require.True(t, ok, "%s missing", k)
		assert.Positive(t, v, k)
	}
	assert.Equal(t, false, rep["scaled_overheads"])
	verdict, ok := rep["verdict"].(map[string]any)
	require.True(t, ok, "verdict missing")
	assert.Equal(t, true, verdict["bytes_equal"])
	assert.Contains(t, verdict, "stalled_ms")
	for mode, target := range map[string]float64{"per_layer": 1.5, "monolithic": 1.25} {
		m, ok := verdict[mode].(map[string]any)
		require.True(t, ok, "verdict.%s missing", mode)
		assert.Equal(t, target, m["target"], mode)
		assert.Equal(t, rep[mode].(map[string]any)["ratio_to_floor"], m["ratio_to_floor"], mode)
		assert.Equal(t, m["ratio_to_floor"].(float64) <= target, m["ok"], mode)
	}
	for _, mode := range []string{"per_layer", "monolithic"} {
		m := rep[mode].(map[string]any)
		for _, k := range []string{"floor_ms", "ratio_to_floor", "effective_gbyte_per_s", "bytes_modeled", "bytes_moved"} {
			v, ok := m[k].(float64)
			require.True(t, ok, "%s.%s missing", mode, k)
			assert.Positive(t, v, "%s.%s", mode, k)
		}
		// A figure below its physical bound is a measurement bug.
		assert.GreaterOrEqual(t, m["ratio_to_floor"].(float64), 1.0, mode)
		for _, k := range []string{"batch_phases_ms", "exposed_phases_ms"} {
			ph, ok := m[k].(map[string]any)
			require.True(t, ok, "%s.%s missing", mode, k)
			for name, d := range ph {
				dd := d.(map[string]any)
				assert.Contains(t, dd, "n", "%s.%s.%s", mode, k, name)
				if dd["n"].(float64) < 100 {
					assert.NotContains(t, dd, "p99", "%s.%s.%s: a p99 of fewer than 100 samples", mode, k, name)
				}
			}
		}
	}
	// 9 hook layers... the small preset has 8 hooks in groups of 4: each
	// chunk per forward sends 2 groups + the MTP buffer.
	assert.GreaterOrEqual(t, rep["submits_per_forward"].(float64), 3.0)

	raw, err := os.ReadFile(trace)
	require.NoError(t, err)
	var tr struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			Pid  int            `json:"pid"`
			Tid  int            `json:"tid"`
			Cat  string         `json:"cat"`
			S    string         `json:"s"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(raw, &tr), "the trace is valid trace-event JSON")
	cats := map[string]map[int]int{}
	type span struct{ from, to float64 }
	tracks := map[[2]int][]span{}
	for _, e := range tr.TraceEvents {
		require.Contains(t, []string{"X", "b", "e", "M", "i"}, e.Ph, "event %q", e.Name)
		switch e.Ph {
		case "i":
			assert.Equal(t, "p", e.S, "instant event %q: scope at top level", e.Name)
			assert.NotContains(t, e.Args, "s", "instant event %q: scope not in args", e.Name)
		case "X":
			tracks[[2]int{e.Pid, e.Tid}] = append(tracks[[2]int{e.Pid, e.Tid}], span{e.Ts, e.Ts + e.Dur})
		}
		if e.Cat != "" {
			if cats[e.Cat] == nil {
				cats[e.Cat] = map[int]int{}
			}
			cats[e.Cat][e.Pid]++
		}
	}
	// Complete slices on one track must nest or follow each other; the
	// trace's slices here never nest.
	for track, spans := range tracks {
		sort.Slice(spans, func(i, j int) bool { return spans[i].from < spans[j].from })
		for i := 1; i < len(spans); i++ {
			assert.LessOrEqual(t, spans[i-1].to, spans[i].from+1e-3, "track %v: complete slices overlap", track)
		}
	}
	for _, c := range []string{"compute", "event_wait", "detect", "post", "transfer", "finish"} {
		assert.Positive(t, cats[c][1], "per-layer run has %s events", c)
		assert.Positive(t, cats[c][2], "monolithic run has %s events", c)
	}

	fh, err := os.Open(pic)
	require.NoError(t, err)
	defer fh.Close()
	img, err := png.Decode(fh)
	require.NoError(t, err, "the picture decodes as PNG")
	assert.Greater(t, img.Bounds().Dx(), 800)
}

// At a time scale other than 1 the real overheads inside modeled times are
// multiplied: the report says so.
func TestSimTimeScaleLabelled(t *testing.T) {
	out, err := run(t, append(quick, "--time-scale", "4", "--json")...)
	require.NoError(t, err, out)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Equal(t, true, rep["scaled_overheads"])
	assert.Contains(t, rep["note"], "do not measure the engine")
	out, err = run(t, append(quick, "--time-scale", "4")...)
	require.NoError(t, err, out)
	assert.Contains(t, out, "WARNING: --time-scale 4")
}

func TestSimText(t *testing.T) {
	out, err := run(t, append(quick, "--layers", "6", "--cp", "2", "--cp-rank", "1", "--cp-rule", "contiguous")...)
	require.NoError(t, err, out)
	assert.Contains(t, out, "bytes_equal: true")
	assert.Contains(t, out, "exposed transfer: monolithic / per-layer")
	assert.Contains(t, out, "CP 1/2 contiguous")
	// The verdict ends the report: each mode against its target, the
	// bytes, and, if the machine kept the run from the CPU, a note.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Regexp(t, `^verdict: per-layer \d+\.\d\d× floor \(target ≤ 1\.5\) (ok|over target), monolithic \d+\.\d\d× \(≤ 1\.25\) (ok|over target), bytes equal: true`+
		`(; the machine was loaded: this process could not run for [\d.]+ ms in total \(stall probe\); figures may be high)?$`, lines[len(lines)-1])
}

// TestSimFaultReport: --fault injects broken connections into the sim's
// transport; the engine resumes, and the JSON report counts per mode the
// faults, the groups re-sent and the chunks failed; the text shows them.
func TestSimFaultReport(t *testing.T) {
	out, err := run(t, append(quick, "--fault", "endpoint-broken:0.1", "--json")...)
	require.NoError(t, err, out)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Equal(t, true, rep["bytes_equal"])
	for _, mode := range []string{"per_layer", "monolithic"} {
		m, ok := rep[mode].(map[string]any)
		require.True(t, ok, mode)
		for _, k := range []string{"faults_injected", "faults_past_resend_limit", "groups_resent", "chunks_resumed", "failed_chunks"} {
			assert.Contains(t, m, k, mode)
		}
		// Only a Work broken more than the resend limit times in a row
		// fails its chunk (the decisions are independent per post, so
		// that is rare, not impossible): every other fault is resumed.
		assert.LessOrEqual(t, m["failed_chunks"], m["faults_past_resend_limit"], mode)
	}
	pl := rep["per_layer"].(map[string]any)
	require.Positive(t, pl["faults_injected"])
	assert.GreaterOrEqual(t, pl["groups_resent"], pl["faults_injected"])
	out, err = run(t, append(quick, "--fault", "endpoint-broken:0.1")...)
	require.NoError(t, err, out)
	assert.Contains(t, out, "transport faults injected (--fault)")
	assert.Contains(t, out, "groups re-sent after a broken or overdue batch")
}

func TestSimBadFlags(t *testing.T) {
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sim", "--model", "gpt5"}, `--model "gpt5": want one of dsv3, llama70b, small`},
		{[]string{"sim", "--cp-rule", "diagonal"}, `--cp-rule: CP rule "diagonal"`},
		{[]string{"sim", "--cp", "2", "--cp-rank", "2"}, "--cp/--cp-rank: CP rank 2: must be in [0, 2)"},
		{[]string{"sim", "--chunk-tokens", "8", "--page-size", "16"}, "--chunk-tokens 8: must be at least one page (16 tokens)"},
		{[]string{"sim", "--requests", "0"}, "--requests 0: must be at least 1"},
		{[]string{"sim", "--link-gbps", "-1"}, "--link-gbps -1: must be positive"},
		{[]string{"sim", "--page-size", "abc"}, `invalid argument "abc" for "--page-size"`},
		{[]string{"sim", "--gpu", "gpu0"}, `--gpu "gpu0": want cuda:N`},
		// Each of these used to panic, hang or exhaust memory (issue 15).
		{[]string{"sim", "--submitters", "-1"}, "--submitters -1: must be within [1, 1024]"},
		{[]string{"sim", "--chunk-tokens", "2000000000"}, "--chunk-tokens 2000000000: above the bound of 16777216"},
		{[]string{"sim", "--prompt-tokens", "9223372036854775807"}, "--prompt-tokens 9223372036854775807: above the bound"},
		{[]string{"sim", "--requests", "9223372036854775807"}, "--requests 9223372036854775807: above the bound of 65536"},
		{[]string{"sim", "--requests", "100000000"}, "--requests 100000000: above the bound of 65536"},
		{[]string{"sim", "--layers", "1000000"}, "--layers 1000000: above the bound of 4096"},
		{[]string{"sim", "--requests", "4096", "--prompt-tokens", "16777216", "--page-size", "16"}, "above the bound of 4194304 pages per run"},
		{[]string{"sim", "--requests", "4096", "--resident", "4096", "--prompt-tokens", "65536", "--page-size", "64"}, "--resident 4096 x --prompt-tokens 65536: each KV pool would take 1984 MiB (4194304 pages of 62 buffers at 8 bytes), above the bound of 1024 MiB"},
		{[]string{"sim", "--resident", "100000"}, "--resident 100000: above the bound of 65536"},
		{[]string{"sim", "--resident", "-1"}, "--resident -1: must not be negative"},
		{[]string{"sim", "--requests", "8", "--prompt-tokens", "1024", "--chunk-tokens", "4096", "--resident", "4"}, "--resident 4: a forward of --chunk-tokens 4096 touches up to 5 requests of --prompt-tokens 1024, which must be resident together"},
		{[]string{"sim", "--link-gbps", "NaN"}, "--link-gbps NaN: must be a finite number"},
		{[]string{"sim", "--link-gbps", "+Inf"}, "--link-gbps +Inf: must be a finite number"},
		// The link's time for the run is beyond a duration's range: it
		// once wrapped, and the run reported 0.46 ms of transfer.
		{[]string{"sim", "--link-gbps", "1e-15"}, "--link-gbps 1e-15: must be above 4.05998e-09 Gb/s for this run: its 4680843264 bytes on one link"},
		{[]string{"sim", "--link-gbps", "4e-09"}, "--link-gbps 4e-09: must be above 4.05998e-09 Gb/s"},
		{[]string{"sim", "--layer-us-per-ktok", "1e6", "--prompt-tokens", "16000000", "--chunk-tokens", "16000000", "--page-size", "65536", "--layers", "4096", "--requests", "1", "--time-scale", "0.001"},
			"--layer-us-per-ktok 1e+06: must be below 140703 for this run"},
		{[]string{"generate", "--link-gbps", "1e-15"}, "--link-gbps 1e-15: must be above 1.36424e-12 Gb/s for this run"},
		{[]string{"sim", "--time-scale", "1e-300"}, "--time-scale 1e-300: must be within [0.001, 1000]"},
		{[]string{"sim", "--time-scale", "1e-9"}, "--time-scale 1e-09: must be within [0.001, 1000]"},
		{[]string{"sim", "--link-latency-us", "NaN"}, "--link-latency-us NaN: must be within [0, 1e+06]"},
		{[]string{"sim", "--memory-mib", "1000000000000000"}, "--memory-mib 1000000000000000: must be within [0, 65536]"},
		{[]string{"sim", "--fault", "endpoint-broken:2"}, `--fault "endpoint-broken:2": rate "2" must be a probability per batch within [0, 1]`},
		{[]string{"sim", "--fault", "cosmic-ray:0.1"}, `--fault "cosmic-ray:0.1": unknown fault "cosmic-ray", want one of endpoint-broken`},
		{[]string{"sim", "--gpu", "cuda:0", "--model", "small", "--requests", "2"}, "fixed check workload (16 buffers, 4 requests, K = 4) and takes no --model, --requests"},
		// PP sized a stage list before it was bounded: a makeslice panic,
		// out of memory, 2.4 GB before failing, a wrong message.
		{[]string{"sim", "--decode-pp", "9223372036854775807"}, "--decode-pp 9223372036854775807: must be within [0, 4096]"},
		{[]string{"sim", "--prefill-pp", "1000000000000"}, "--prefill-pp 1000000000000: must be within [0, 4096]"},
		{[]string{"sim", "--prefill-pp", "300000000"}, "--prefill-pp 300000000: must be within [0, 4096]"},
		{[]string{"sim", "--prefill-pp", "100000"}, "--prefill-pp 100000: must be within [0, 4096]"},
		{[]string{"sim", "--prefill-pp", "63"}, "--prefill-pp 63 (--model dsv3, 62 layers): PP 63: more stages than the 62 layers"},
		{[]string{"prefill", "--prefill-pp", "300000000"}, "--prefill-pp 300000000: must be within [0, 4096]"},
		// Negative degrees ran unsharded and succeeded.
		{[]string{"sim", "--decode-tp", "-1"}, "--decode-tp -1: must be within [0, 1024]"},
		{[]string{"sim", "--prefill-tp", "-1"}, "--prefill-tp -1: must be within [0, 1024]"},
		{[]string{"sim", "--prefill-pp", "-1"}, "--prefill-pp -1: must be within [0, 4096]"},
		{[]string{"sim", "--decode-pp", "-4"}, "--decode-pp -4: must be within [0, 4096]"},
		{[]string{"prefill", "--decode-tp", "-1"}, "--decode-tp -1: must be within [0, 1024]"},
		{[]string{"sim", "--metrics-linger", "-5s"}, "--metrics-linger -5s: must not be negative"},
		{[]string{"sim", "--metrics-linger", "5s"}, "--metrics-linger 5s: needs --metrics-addr"},
	} {
		_, err := run(t, tc.args...)
		require.Error(t, err, "%v", tc.args)
		assert.Contains(t, err.Error(), tc.want)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "refusals allocate nothing from the values they refuse")
}

// TestSimSlowLinkWithinTheBound: 0.001 Gb/s is far within the bound of
// --link-gbps, and a run at it models its transfer: 165888 bytes (16
// tokens of 9 layers of 1152 bytes) take 1.327 s on the link. The ideal
// floor is nearly all of it (only what crosses while the forward's few
// modeled milliseconds compute is hidden), never the wrapped few
// microseconds, and the exposed time is at least the floor.
func TestSimSlowLinkWithinTheBound(t *testing.T) {
	out, err := run(t, "sim", "--model", "small", "--requests", "1", "--prompt-tokens", "16", "--chunk-tokens", "16",
		"--page-size", "16", "--group", "4", "--no-progress", "--json", "--link-gbps", "0.001")
	require.NoError(t, err, out)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	for _, mode := range []string{"per_layer", "monolithic"} {
		m, ok := rep[mode].(map[string]any)
		require.True(t, ok, "%s missing", mode)
		floor, _ := m["floor_ms"].(float64)
		exposed, _ := m["exposed_ms"].(float64)
		assert.Greater(t, floor, 1300.0, "%s: the floor holds the modeled 1.327 s on the link", mode)
		assert.GreaterOrEqual(t, exposed, floor, "%s: exposed below its floor is a measurement bug", mode)
	}
}

// TestSimRecordToAFullDevice: a trace that cannot be written is the run's
// error; it used to exit 0 with an empty file.
func TestSimRecordToAFullDevice(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full here")
	}
	_, err := run(t, "sim", "--no-progress", "--model", "small", "--requests", "1", "--prompt-tokens", "256", "--chunk-tokens", "256", "--record", "/dev/full")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no space left on device")
}

// Without a CUDA driver, --gpu says so plainly.
func TestSimGPUWithoutDriver(t *testing.T) {
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libcuda.so.1"); err == nil {
		t.Skip("a CUDA driver is installed here")
	}
	_, err := run(t, "sim", "--gpu", "cuda:0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--gpu cuda:0")
	assert.Contains(t, err.Error(), "libcuda.so.1 not found")
}

func TestHelpListsSim(t *testing.T) {
	out, err := run(t, "--help")
	require.NoError(t, err)
	assert.Contains(t, out, "sim")
}

// syncBuffer is a bytes.Buffer safe for the command's writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestSimServesMetrics scrapes /metrics from a running sim and finds the
// documented names, labelled by run.
func TestSimServesMetrics(t *testing.T) {
	root := newRoot()
	var out syncBuffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append(quick, "--metrics-addr", "127.0.0.1:0", "--metrics-linger", "3s"))
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()

	addr := regexp.MustCompile(`serving metrics at (http://[^ ]+/metrics)`)
	var url string
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond)
	// Scrape once the sim finished (during the linger): every figure is in.
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "bytes_equal: true") }, 60*time.Second, 50*time.Millisecond)
	resp, err := http.Get(url)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	for _, name := range []string{
		system.MetricPostedBytes, system.MetricBatches, system.MetricEventWait, system.MetricBatchSeconds,
		system.MetricFinishSeconds, system.MetricExposedTransfer, system.MetricRegistrations, system.MetricChunks,
	} {
		assert.Contains(t, string(body), name, "scrape lacks %s", name)
	}
	// Both runs add up in one registry, told apart by the mode of their
	// registrations; no label the documentation does not list.
	assert.Regexp(t, `kvstream_registrations_total\{mode="per_layer",reason="one_destination"\} [1-9]`, string(body))
	assert.Regexp(t, `kvstream_registrations_total\{mode="monolithic",reason="per_layer_off"\} [1-9]`, string(body))
	assert.NotContains(t, string(body), `run="`)
	assert.Contains(t, out.String(), "metrics: batches")
	require.NoError(t, <-done)
}

// TestSimRecordReplays records a sim run's trace and replays it with no
// divergence, through `kvstream replay` (cores and engine).
func TestSimRecordReplays(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sim.jsonl")
	out, err := run(t, append(quick, "--record", path)...)
	require.NoError(t, err, out)
	out, err = run(t, "replay", "--engine", path)
	require.NoError(t, err, out)
	assert.Contains(t, out, "no divergence")
	assert.Contains(t, out, "chunk statuses: SUCCESS 8")
	assert.Contains(t, out, "engine replay: same statuses, bytes equal")

	// A trace with one message removed diverges: exit status 1.
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(string(raw), "\n")
	for i, l := range lines {
		if strings.Contains(l, `"type":"Boundary"`) {
			lines = append(lines[:i], lines[i+1:]...)
			break
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(strings.Join(lines, "\n")), 0o644))
	out, err = run(t, "replay", bad)
	require.Error(t, err)
	assert.Contains(t, out, "divergence at record")
}

// TestSimSharded: one engine per prefill TP rank, one decode pool per
// decode rank, a short prompt; every decode byte equals the reshard of the
// logical tensor, and the report names the pairing and counts every rank's
// submits and writes.
func TestSimSharded(t *testing.T) {
	for _, tc := range []struct {
		name           string
		args           []string
		pre, dec       int
		submits, monos int // batches per forward, all prefill ranks: per layer, monolithic
	}{
		// 8 KV heads: a prefill rank holds 1, replicated on 2 decode ranks;
		// 10 groups to each.
		{"llama70b GQA TP 8->16", []string{"--model", "llama70b", "--prefill-tp", "8", "--decode-tp", "16"}, 8, 16, 8 * 2 * 10, 8 * 2},
		// MLA: every rank holds the latent; rank r sends it to r and r + 8,
		// 8 groups and the MTP rest to each.
		{"dsv3 MLA TP 8->16", []string{"--model", "dsv3", "--prefill-tp", "8", "--decode-tp", "16"}, 8, 16, 8 * 2 * 9, 8 * 2},
		// PP: prefill stages [0, 26) [26, 53) [53, 80), decode [0, 40) [40,
		// 80); per TP rank, stage 0's 4 groups go to decode stage 0, stage
		// 1's 4 groups to stage 0 or 1 and one ([34, 42)) to both, stage 2's
		// 4 to stage 1: 13; monolithic 1 + 2 + 1.
		{"llama70b GQA TP 2 x PP 3 -> TP 2 x PP 2", []string{"--model", "llama70b", "--prefill-tp", "2", "--decode-tp", "2",
			"--prefill-pp", "3", "--decode-pp", "2"}, 2, 2, 2 * 13, 2 * 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"sim", "--requests", "1", "--prompt-tokens", "128",
				"--chunk-tokens", "64", "--no-progress", "--json"}, tc.args...)
			out, err := run(t, args...)
			require.NoError(t, err, out)
			var rep map[string]any
			require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
			assert.Equal(t, true, rep["bytes_equal"], rep["mismatch"])
			assert.EqualValues(t, tc.pre, rep["prefill_tp"])
			assert.EqualValues(t, tc.dec, rep["decode_tp"])
			assert.Equal(t, "head-major", rep["page_order"])
			pl, mo := rep["per_layer"].(map[string]any), rep["monolithic"].(map[string]any)
			assert.EqualValues(t, tc.submits, pl["submits_per_forward"])
			assert.EqualValues(t, tc.monos, mo["submits_per_forward"])
			// Per layer splits the same writes into groups: as many blocks.
			assert.Positive(t, pl["blocks_per_forward"])
			assert.Equal(t, pl["blocks_per_forward"], mo["blocks_per_forward"])
			for _, m := range []map[string]any{pl, mo} {
				assert.Positive(t, m["floor_ms"])
				assert.Positive(t, m["exposed_ms"])
				// A figure below its physical bound is a measurement bug.
				assert.GreaterOrEqual(t, m["ratio_to_floor"].(float64), 1.0)
			}
		})
	}
}

// An impossible pairing is a flag error naming the values, before anything
// is allocated.
func TestSimShardedBadPairing(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "llama70b", "--prefill-tp", "3", "--decode-tp", "16"}, "--prefill-tp 3 --decode-tp 16 (--model llama70b): prefill: 8 KV heads do not split over TP 3"},
		{[]string{"--model", "llama70b", "--prefill-tp", "8", "--decode-tp", "12"}, "--prefill-tp 8 --decode-tp 12 (--model llama70b): decode: TP 12 is not a multiple of the 8 KV heads it replicates"},
		{[]string{"--model", "llama70b", "--prefill-tp", "4", "--scale", "3"}, "--scale 3: a sharded run scales the head dim, and 3 does not divide llama70b's 128"},
		{[]string{"--prefill-tp", "2", "--page-order", "diagonal"}, `--page-order "diagonal": want head-major or token-major`},
		{[]string{"--model", "small", "--prefill-pp", "12"}, "--prefill-pp 12 (--model small, 9 layers): PP 12: more stages than the 9 layers (each stage holds at least one)"},
		{[]string{"--prefill-tp", "2", "--plot", "x.png"}, "--trace-out and --plot draw one prefill rank; a sharded run (--prefill-tp 2 --decode-tp 0) has several"},
	} {
		_, err := run(t, append([]string{"sim"}, tc.args...)...)
		require.Error(t, err, "%v", tc.args)
		assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
		assert.Contains(t, err.Error(), tc.want)
	}
}
