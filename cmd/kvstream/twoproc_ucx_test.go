//go:build ucx

package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cli runs this test binary as the kvstream command (see TestMain), in its
// own process: prefill and decode really are two processes.
type cli struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	lines  chan string   // stdout and stderr lines as they come
	done   chan struct{} // closed once the process exited; then err
	err    error
}

func startCLI(t *testing.T, env []string, args ...string) *cli {
	t.Helper()
	c := &cli{cmd: exec.Command(os.Args[0], args...), lines: make(chan string, 1024), done: make(chan struct{})}
	c.cmd.Env = append(append(os.Environ(), cliMainEnv+"=1"), env...)
	outR, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	errR, err := c.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	var wg sync.WaitGroup
	pump := func(r io.Reader, into *bytes.Buffer) {
		defer wg.Done()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.mu.Lock()
			into.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			select {
			case c.lines <- sc.Text():
			default:
			}
		}
	}
	wg.Add(2)
	go pump(outR, &c.stdout)
	go pump(errR, &c.stderr)
	go func() { wg.Wait(); c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { _ = c.cmd.Process.Kill() })
	return c
}

func (c *cli) waitLine(t *testing.T, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-c.lines:
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-deadline:
			t.Fatalf("no line matching %s within %v; stdout:\n%s\nstderr:\n%s", re, timeout, c.out(), c.errOut())
		}
	}
}

// wait returns how the process exited, waiting up to timeout (fatal
// after); any number of times.
func (c *cli) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-c.done:
		return c.err
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		t.Fatalf("process did not exit within %v; stdout:\n%s\nstderr:\n%s", timeout, c.out(), c.errOut())
		return nil
	}
}

func (c *cli) out() string    { c.mu.Lock(); defer c.mu.Unlock(); return c.stdout.String() }
func (c *cli) errOut() string { c.mu.Lock(); defer c.mu.Unlock(); return c.stderr.String() }

var listening = regexp.MustCompile(`decode: listening on (\S+)`)

// TestTwoProcess runs decode and prefill as two processes on 127.0.0.1 with
// the KV over UCX: TCP, and shared memory. The decode records its server's
// message trace, which kvstream replay then replays without a divergence.
func TestTwoProcess(t *testing.T) {
	t.Parallel()
	for _, tls := range []string{"tcp", "sm,self"} {
		t.Run(strings.ReplaceAll(tls, ",", "+"), func(t *testing.T) {
			env := []string{"UCX_TLS=" + tls}
			record := filepath.Join(t.TempDir(), "decode.trace")
			dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m", "--record", record)
			addr := dec.waitLine(t, listening, 30*time.Second)[1]
			pre := startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "3",
				"--prompt-tokens", "2000", "--chunk-tokens", "1024", "--page-size", "16", "--group", "4")
			require.NoError(t, pre.wait(t, 2*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
			require.NoError(t, dec.wait(t, 30*time.Second), "decode:\n%s\n%s", dec.out(), dec.errOut())
			// 3 requests x 125 pages x 9 buffers of the small model: every
			// page went over UCX and was checked by the other process.
			assert.Contains(t, pre.out(), "0 chunks failed")
			assert.Contains(t, pre.out(), "decode accepted 8 chunks")
			assert.Contains(t, pre.out(), "bytes equal: true")
			assert.Regexp(t, `decode: served 1 sessions \(1 complete\): 8 chunks \(0 not successful\), 3 rooms complete, 3375 pages verified, bytes equal: true`, dec.out())

			rp := startCLI(t, nil, "replay", record)
			require.NoError(t, rp.wait(t, time.Minute), "replay:\n%s\n%s", rp.out(), rp.errOut())
			assert.Contains(t, rp.out(), "decode server")
			assert.Regexp(t, `1 sessions \(ended: complete 1\), 3 rooms ended \(complete 3\)`, rp.out())
			assert.Contains(t, rp.out(), "no divergence")
		})
	}
}

// TestTwoProcessSharded runs a sharded prefill (one engine per prefill
// stage and TP rank) and a sharded decode (one pool, server and session per
// decode stage and TP rank) as two processes with the KV over UCX: GQA
// head slices to more decode ranks over TCP, and the MLA latent from two
// PP stages to three over shared memory. Every decode rank checks every
// page of every chunk against its share of the model's KV.
func TestTwoProcessSharded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, tls string
		shard     []string
		prefill   string
		decode    string
	}{
		// 4 ranks x 2 requests x 63 pages x (4 layers x K, V); 5 chunks
		// (512 + 488 tokens, then 16 + 512 + 472), each told to every rank.
		{"llama70b-tp2-to-tp4", "tcp", []string{"--model", "llama70b", "--prefill-tp", "2", "--decode-tp", "4"},
			"per-layer sharded (prefill TP 2 x PP 1 -> decode TP 4 x PP 1, head-major pages)",
			`decode: served 4 sessions on 4 ranks \(4 complete\): 20 chunks \(0 not successful\), 8 rooms complete, 4032 pages verified, bytes equal: true`},
		// 3 ranks holding 5 layers (4 + the MTP layer) between them.
		{"dsv3-tp2pp2-to-pp3", "sm,self", []string{"--model", "dsv3", "--prefill-tp", "2", "--prefill-pp", "2", "--decode-pp", "3", "--page-order", "token-major"},
			"per-layer sharded (prefill TP 2 x PP 2 -> decode TP 1 x PP 3, token-major pages)",
			`decode: served 3 sessions on 3 ranks \(3 complete\): 15 chunks \(0 not successful\), 6 rooms complete, 630 pages verified, bytes equal: true`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{"UCX_TLS=" + tc.tls}
			dec := startCLI(t, env, append([]string{"decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m"}, tc.shard...)...)
			addr := dec.waitLine(t, listening, 30*time.Second)[1]
			pre := startCLI(t, env, append([]string{"prefill", "--decode", addr, "--layers", "4", "--requests", "2",
				"--prompt-tokens", "1000", "--chunk-tokens", "512", "--page-size", "16", "--group", "2"}, tc.shard...)...)
			require.NoError(t, pre.wait(t, 2*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
			require.NoError(t, dec.wait(t, 30*time.Second), "decode:\n%s\n%s", dec.out(), dec.errOut())
			assert.Contains(t, pre.out(), tc.prefill)
			assert.Contains(t, pre.out(), "0 chunks failed")
			assert.Contains(t, pre.out(), "bytes equal: true")
			assert.Regexp(t, tc.decode, dec.out())
		})
	}
}

// TestTwoProcessShardingMismatch: a prefill started with other sharding
// flags than the decode process stops, naming the flag and both values,
// and the decode process logs the same; nothing is sized or sent. The
// decode process keeps serving, and the prefill restarted with its flags
// completes.
func TestTwoProcessShardingMismatch(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m", "--model", "llama70b", "--prefill-tp", "2", "--decode-tp", "2")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	args := []string{"prefill", "--decode", addr, "--model", "llama70b", "--layers", "4", "--requests", "1",
		"--prompt-tokens", "256", "--chunk-tokens", "256", "--page-size", "16", "--prefill-tp", "2"}
	pre := startCLI(t, env, append(args, "--decode-tp", "4")...)
	require.Error(t, pre.wait(t, time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	const want = "the prefill runs --decode-tp 4, this decode process --decode-tp 2"
	assert.Contains(t, pre.errOut(), want)
	dec.waitLine(t, regexp.MustCompile(regexp.QuoteMeta(want)), 30*time.Second)

	pre = startCLI(t, env, append(args, "--decode-tp", "2")...)
	require.NoError(t, pre.wait(t, time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	require.NoError(t, dec.wait(t, 30*time.Second), "decode:\n%s\n%s", dec.out(), dec.errOut())
	assert.Contains(t, pre.out(), "bytes equal: true")
}

// TestPeerKilledMidTransfer kills the decode process while the prefill
// streams into it: the prefill reports the loss and failure within its
// finish timeout, and exits non-zero; nothing hangs.
func TestPeerKilledMidTransfer(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	pre := startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "4",
		"--prompt-tokens", "8192", "--chunk-tokens", "1024", "--page-size", "16", "--layer-us-per-ktok", "5000",
		"--finish-timeout", "3s")
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 2/\d+ done`), time.Minute)
	require.NoError(t, dec.cmd.Process.Kill())
	killed := time.Now()
	err := pre.wait(t, time.Minute)
	require.Error(t, err, "the prefill must not report success")
	assert.Less(t, time.Since(killed), 30*time.Second, "bounded by the finish timeout, not hanging")
	out := pre.out()
	assert.Contains(t, out, "decode lost")
	assert.Contains(t, out, "bytes equal: not compared for every chunk (none compared differed)", "a killed decode compared nothing more: no byte differed")
}
