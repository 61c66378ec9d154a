package soak

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseMix(t *testing.T) {
	m, err := ParseMix(DefaultMix)
	require.NoError(t, err)
	assert.Equal(t, Mix{Clean: 4, Kill: 2, Stop: 2, PauseDecode: 1, Vanish: 1, Refused: 1, ByeWriter: 1}, m)
	assert.Equal(t, DefaultMix, m.String())

	m, err = ParseMix(" kill = 3 , clean=0,")
	require.NoError(t, err)
	assert.Equal(t, Mix{Kill: 3, Clean: 0}, m)
	assert.Equal(t, "kill=3", m.String(), "a kind of weight 0 does not run")

	for _, tc := range []struct{ in, want string }{
		{"clean=1,crash=2", `--mix "clean=1,crash=2": unknown kind "crash": want clean, kill, stop, pause-decode, vanish, refused or bye-writer`},
		{"clean", `--mix "clean": "clean" is not kind=weight`},
		{"clean=1,clean=2", `--mix "clean=1,clean=2": clean given twice`},
		{"clean=-1", `--mix "clean=-1": clean=-1: want a weight from 0 to 1000`},
		{"clean=1001", `--mix "clean=1001": clean=1001: want a weight from 0 to 1000`},
		{"clean=x", `--mix "clean=x": clean=x: want a weight from 0 to 1000`},
		{"vanish=1,refused=1", `--mix "vanish=1,refused=1": no main-lane kind (clean, kill, stop or pause-decode) has a positive weight`},
		{"", `--mix "": no main-lane kind`},
	} {
		_, err := ParseMix(tc.in)
		assert.ErrorContains(t, err, tc.want, "%q", tc.in)
	}
}

// TestPickerCoversEveryKindFirst: each kind of positive weight comes once
// (and again until it is covered) before any draw by weight; the draws
// follow the weights.
func TestPickerCoversEveryKindFirst(t *testing.T) {
	mix := Mix{Clean: 4, Kill: 2, Stop: 0, PauseDecode: 1}
	p := newPicker(rand.New(rand.NewPCG(7, 7)), MainKinds, mix)
	var first []Kind
	for !p.done() {
		k := p.next()
		assert.Equal(t, k, p.next(), "the same kind until it is covered")
		p.covered(k)
		first = append(first, k)
	}
	assert.ElementsMatch(t, []Kind{Clean, Kill, PauseDecode}, first)

	counts := map[Kind]int{}
	const n = 9000
	for range n {
		counts[p.next()]++
	}
	assert.Zero(t, counts[Stop], "weight 0 never runs")
	for k, w := range mix {
		assert.InDelta(t, float64(n*w)/7, float64(counts[k]), n*0.03, "%s", k)
	}
}

func validConfig() Config {
	return Config{Command: func(args ...string) *exec.Cmd { return exec.Command("kvstream", args...) }, For: time.Minute, Mix: Mix{Clean: 1}, Bounds: DefaultBounds,
		Heartbeat: 2 * time.Second, Settle: time.Second, Workload: DefaultWorkload}
}

// TestConfigErrorsNameTheFlag: bad input names the flag, the value and the
// bound or the choices.
func TestConfigErrorsNameTheFlag(t *testing.T) {
	c := validConfig()
	require.NoError(t, c.Check())
	for _, tc := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.For = 0 }, "--for 0s: want more than 0, at most 24h0m0s"},
		{func(c *Config) { c.For = 25 * time.Hour }, "--for 25h0m0s"},
		{func(c *Config) { c.Episodes = -1 }, "--episodes -1: must not be negative"},
		{func(c *Config) { c.Mix = Mix{Vanish: 1} }, "no main-lane kind"},
		{func(c *Config) { c.Mix = Mix{Clean: 1, ByeWriter: 1} }, "bye-writer but Config.Open is nil"},
		{func(c *Config) { c.Heartbeat = 100 * time.Millisecond }, "--heartbeat 100ms: want 500ms to 1m0s"},
		{func(c *Config) { c.Settle = -time.Second }, "--settle -1s: want 0 to 1m0s"},
		{func(c *Config) { c.Bounds.RSSGrowthMiB = -1 }, "--max-rss-growth-mib -1"},
		{func(c *Config) { c.Bounds.FDGrowth = -1 }, "--max-fd-growth -1"},
		{func(c *Config) { c.Bounds.GoroutineGrowth = -2 }, "--max-goroutine-growth -2"},
		{func(c *Config) { c.Workload.Scale = 0 }, "--scale 0: must be at least 1"},
		{func(c *Config) { c.Workload.LayerUsPerKTok = 0 }, "--layer-us-per-ktok 0"},
		{func(c *Config) { c.Workload.Requests = 0 }, "--requests 0: must be at least 1"},
		{func(c *Config) { c.Workload.ChunkTokens = 8 }, "--chunk-tokens 8: must be at least one page (16 tokens)"},
		{func(c *Config) { c.Command = nil }, "Config.Command is nil"},
	} {
		c := validConfig()
		tc.change(&c)
		assert.ErrorContains(t, c.Check(), tc.want)
	}
}

// TestWorkloadLayout: the prefills' pool and pages, every request its own
// pages (all resident), and the flags that give the same workload.
func TestWorkloadLayout(t *testing.T) {
	w := DefaultWorkload
	geom, pages, err := w.Layout(1)
	require.NoError(t, err)
	assert.Len(t, geom.Names, 9, "the small model's 8 layers and its MTP layer")
	assert.Equal(t, uint64(16*576*2/4), geom.ItemLen, "a page of 16 tokens of 576 bf16 values, a quarter of its bytes")
	require.Len(t, pages, w.Requests)
	seen := map[int]bool{}
	for _, ps := range pages {
		assert.Len(t, ps, w.PromptTokens/w.PageSize)
		for _, p := range ps {
			assert.False(t, seen[p], "page %d is two requests'", p)
			seen[p] = true
			assert.Less(t, p, geom.Pages)
		}
	}
	assert.Equal(t, []string{"--requests", "3", "--prompt-tokens", "1024", "--chunk-tokens", "512", "--page-size", "16",
		"--scale", "4", "--layer-us-per-ktok", "20000"}, w.Flags())
}

// TestJudge: each count and bound that fails a soak, and a soak that
// passes.
func TestJudge(t *testing.T) {
	good := func() Report {
		return Report{Bounds: DefaultBounds, Samples: 10, DecodeExit: exitClean, StartFigures: true, EndFigures: true,
			RSSMiB: Usage{Start: 40, Peak: 90, End: 100}, FDs: Usage{Start: 20, Peak: 60, End: 24}, Goroutines: Usage{Start: 24, Peak: 60, End: 40}}
	}
	r := good()
	r.judge()
	assert.True(t, r.OK, "growth equal to each bound passes: %v", r.Failures)
	assert.Empty(t, r.Failures)

	for _, tc := range []struct {
		change func(*Report)
		want   string
	}{
		{func(r *Report) { r.DecodeCrashes, r.Crash = 1, "panic: boom" }, "decode crashed: panic: boom"},
		{func(r *Report) { r.Corrupt = 2 }, "2 legitimate sessions without every byte equal"},
		{func(r *Report) { r.LegitFailed = 1 }, "1 legitimate sessions failed"},
		{func(r *Report) { r.ByeWriter.LandedAfterBye = 3 }, "3 bye-writer writes completed after their Bye returned"},
		{func(r *Report) { r.Misbehaved = 1 }, "1 faults not answered as they must be"},
		{func(r *Report) { r.DecodeExit = "exit status 1" }, "decode after SIGTERM: exit status 1"},
		{func(r *Report) { r.RSSMiB.End = 104.5 }, "decode RSS grew 64.5 MiB (40.0 to 104.5), above --max-rss-growth-mib 64"},
		{func(r *Report) { r.FDs.End = 25 }, "decode open files grew by 5 (20 to 25), above --max-fd-growth 4"},
		{func(r *Report) { r.Goroutines.End = 41 }, "decode goroutines grew by 17 (24 to 41), above --max-goroutine-growth 16"},
		{func(r *Report) { r.Interrupted = "the soak's context ended" }, "interrupted: the soak's context ended"},
		{func(r *Report) { r.EndFigures = false }, "the decode process's start and end figures were not both taken"},
	} {
		r := good()
		tc.change(&r)
		r.judge()
		assert.False(t, r.OK, tc.want)
		assert.Contains(t, strings.Join(r.Failures, "\n"), tc.want)
		assert.Contains(t, r.Text(), "FAILED: ")
	}
}

// TestDecodeLines: the decode's lines that the soak reads: its addresses,
// each session's opening (its DEBUG line) and end (by the prefill's
// name), its summary, and the lines of a crash.
func TestDecodeLines(t *testing.T) {
	d := &decodeProc{open: map[string]int{}, opened: map[string]bool{}, openedAt: map[string]time.Time{}, endedAt: map[string]time.Time{}, outcome: map[string]string{},
		changed: make(chan struct{}), crashed: make(chan struct{})}
	assert.False(t, d.line("decode: listening on 127.0.0.1:4100 (transport ucx)"))
	assert.True(t, d.line("kvstream: serving metrics at http://127.0.0.1:4101/metrics (also /healthz, /readyz)"))
	assert.Equal(t, "127.0.0.1:4100", d.addr)
	assert.Equal(t, "127.0.0.1:4101", d.metrics)

	changed := d.changed
	d.line(`2026-12-06T05:04:34.663Z	DEBUG	prefill session	{"server": "", "prefill": "127.0.0.1:42515", "identity": "127.0.0.1:42515", "rank": 0}`)
	d.line(`2026-12-06T05:04:34.700Z	DEBUG	prefill session	{"server": "", "prefill": "soak-vanish-3", "identity": "soak-vanish-3", "rank": 0}`)
	d.line(`2026-12-06T05:04:34.727Z	DEBUG	prefill session ended	{"server": "", "prefill": "127.0.0.1:42515", "outcome": "complete"}`)
	select {
	case <-changed:
	default:
		t.Fatal("an opened session wakes the waiters")
	}
	assert.ElementsMatch(t, []string{"127.0.0.1:42515"}, d.openSessions(false))
	assert.ElementsMatch(t, []string{"127.0.0.1:42515", "soak-vanish-3"}, d.openSessions(true))
	_, ok := d.endOf("127.0.0.1:42515")
	assert.False(t, ok, "the DEBUG line of its end is not the end: the stdout line after its revocation is")

	d.line("decode: session of 127.0.0.1:42515 ended complete: 8 chunks (0 not successful), 3 rooms complete")
	d.line("decode: session of soak-vanish-3 ended lost: 0 chunks (0 not successful), 0 rooms complete; prefill lost")
	o, ok := d.endOf("127.0.0.1:42515")
	assert.True(t, ok)
	assert.Equal(t, "complete", o)
	o, _ = d.endOf("soak-vanish-3")
	assert.Equal(t, "lost", o)
	assert.Empty(t, d.openSessions(true))
	assert.True(t, d.hasOpened("soak-vanish-3"))
	assert.True(t, d.waitFor(time.Millisecond, nil, func() bool { return len(d.openLocked(true)) == 0 }))

	d.line("decode: served 2 sessions (1 complete, 1 lost): 8 chunks (0 not successful), 3 rooms complete, 1125 pages verified, bytes equal: true")
	assert.Contains(t, d.summary, "served 2 sessions")

	for _, l := range []string{
		"[1796534314.364768] [vm:8638 :0] ucp_worker.c:1234 UCX Fatal: unexpected tag",
		"panic: runtime error: index out of range [3] with length 3",
		"fatal error: concurrent map writes",
		"[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x0]",
		"SIGABRT: abort",
		"==== backtrace (tid: 8638) ==== Caught signal 11 (Segmentation fault: address not mapped)",
		`2026-12-06T05:04:34.663Z	ERROR	decode server: handler panicked	{"message": "*wire.Hello", "panic": "boom"}`,
		"WARNING: DATA RACE",
		"[vm:27572:0:27595] ucp_request.c:684  Assertion `(req->send.wireup.type == UCP_WIREUP_MSG_EP_REMOVED)' failed: req 0x7fc5203c7f00 ep 0x7fc51bec0000: got REP message",
	} {
		c := &decodeProc{changed: make(chan struct{}), crashed: make(chan struct{})}
		c.line("decode: listening on 127.0.0.1:4100 (transport ucx)")
		c.line(l)
		assert.Equal(t, l, c.crashedWhy())
		select {
		case <-c.crashed:
		default:
			t.Fatalf("%q: no crash", l)
		}
		assert.False(t, c.waitFor(time.Minute, nil, func() bool { return false }), "a crash ends every wait")
	}
	c := &decodeProc{changed: make(chan struct{}), crashed: make(chan struct{})}
	for i := range 15 {
		c.line(fmt.Sprintf("before %d", i))
	}
	c.line("SIGABRT: abort")
	for i := range 50 {
		c.line(fmt.Sprintf("after %d", i))
	}
	lines := strings.Split(c.crashLines(), "\n")
	require.Len(t, lines, crashBefore+1+crashAfter, "the lines around the first crash line")
	assert.Equal(t, "before 5", lines[0])
	assert.Equal(t, "SIGABRT: abort", lines[crashBefore])
	assert.Equal(t, fmt.Sprintf("after %d", crashAfter-1), lines[len(lines)-1])

	for _, l := range []string{
		`2026-12-06T05:04:34.733Z	ERROR	EndpointWriter lost connection	{"address": "127.0.0.1:42515", "error": "rpc error: code = Unavailable desc = error reading from server: EOF"}`,
		"decode: session of 127.0.0.1:1 ended lost: 0 chunks (0 not successful), 0 rooms complete; prefill 127.0.0.1:1 lost: no heartbeat answer for 2.1s",
		"[1796534326.600288] [vm:8771 :0] mm_ep.c:171 UCX ERROR mm ep failed to connect to remote FIFO id 0x37802a: Shared memory error",
	} {
		c := &decodeProc{open: map[string]int{}, opened: map[string]bool{}, openedAt: map[string]time.Time{}, endedAt: map[string]time.Time{}, outcome: map[string]string{},
			changed: make(chan struct{}), crashed: make(chan struct{})}
		c.line(l)
		assert.Empty(t, c.crashedWhy(), "%q is no crash", l)
	}
}
