//go:build ucx

package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/internal/nettest"
	"github.com/kvstream/kvstream/lab/metricsdoc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sessionActor is the prefill session actor a decode started with
// --verbose logs when it opens a session.
var sessionActor = regexp.MustCompile(`prefill session.*"actor": "([^"/]+)/([^"]+)"`)

// streaming is a prefill slow enough to be mid-transfer for seconds.
var streaming = []string{"--model", "small", "--requests", "2", "--prompt-tokens", "6144", "--chunk-tokens", "1024",
	"--page-size", "16", "--layer-us-per-ktok", "3000"}

// TestUCXForgedTerminatedDuringTransfer: one protoactor Terminated naming
// the prefill's session actor, sent in the clear by another local process
// while the prefill streams over UCX, used to make the decode declare the
// session lost and unmap its pool under the prefill's writes (SIGSEGV in
// libucs, 3 of 3). A Terminated is a suspicion the heartbeats settle: the
// decode stays up and the prefill completes byte-equal.
func TestUCXForgedTerminatedDuringTransfer(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "3m", "--verbose")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	pre := startCLI(t, env, append([]string{"prefill", "--decode", addr}, streaming...)...)
	m := dec.waitLine(t, sessionActor, time.Minute)
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 2/\d+ done`), time.Minute)
	forged := batch(actor.NewPID(addr, decode.ServerActor), actor.NewPID(m[1], "rogue"), &actor.Terminated{Who: actor.NewPID(m[1], m[2])})
	// Sent until the decode logs that it reached its server (the stream
	// may end after the delivery: what matters is what the server did).
	// The log line comes after the delivery: each send is given a second
	// to show it before the next (a send answers as soon as the node read
	// the batch).
	delivered := regexp.MustCompile(`prefill session actor reported gone; the session goes on`)
	for deadline := time.Now().Add(time.Minute); !delivered.MatchString(dec.errOut()); {
		require.True(t, time.Now().Before(deadline), "the forged Terminated never reached the server")
		_ = attacker{t: t, addr: addr}.send(forged)
		for shown := time.Now().Add(time.Second); time.Now().Before(shown) && !delivered.MatchString(dec.errOut()); {
			time.Sleep(10 * time.Millisecond) // polled: the decode's log
		}
	}
	require.NoError(t, pre.wait(t, 3*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	require.NoError(t, dec.wait(t, time.Minute), "decode:\n%s\n%s", dec.out(), dec.errOut())
	assert.Contains(t, pre.out(), "0 chunks failed")
	assert.Contains(t, pre.out(), "bytes equal: true")
	assert.Regexp(t, `decode: served 1 sessions \(1 complete\): 12 chunks \(0 not successful\), 2 rooms complete, \d+ pages verified, bytes equal: true`, dec.out())
	assert.Contains(t, dec.errOut(), "prefill session actor reported gone; the session goes on")
}

// TestUCXPrefillCutOffWhileWriting: the decode really declares its prefill
// lost (a test hook cuts it off after two chunks) while the prefill keeps
// writing. Nothing crashes. With message writes (the default), over TCP and
// shared memory alike, the prefill's access point is revoked: its rooms
// fail as lost, quiet, and the next prefill is served byte-equal on the
// same pages. With UCX's RMA over shared memory (--ucx-writes rma) the
// prefill may write the pool itself, which no revocation stops: its rooms
// are reported not quiesced, their pages are kept out for good, and the
// next prefill, whose schedule names the same pages, is refused them.
func TestUCXPrefillCutOffWhileWriting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tls, writes string
		direct      bool
	}{{"tcp", "messages", false}, {"sm,self", "messages", false}, {"sm,self", "rma", true}} {
		t.Run(strings.ReplaceAll(tc.tls, ",", "+")+"/"+tc.writes, func(t *testing.T) {
			env := []string{"UCX_TLS=" + tc.tls}
			writes := []string{"--ucx-writes", tc.writes}
			dec := startCLI(t, append(env, disconnectAfterEnv+"=2"), append([]string{"decode", "--listen", "127.0.0.1:0", "--sessions", "2", "--wait", "3m"}, writes...)...)
			addr := dec.waitLine(t, listening, 30*time.Second)[1]
			pre := startCLI(t, env, append(append([]string{"prefill", "--decode", addr, "--finish-timeout", "10s"}, writes...), streaming...)...)
			require.Error(t, pre.wait(t, 3*time.Minute), "the prefill that was cut off cannot succeed")
			dec.waitLine(t, regexp.MustCompile(`session of .* ended lost: .*cut off by a test hook \(DisconnectAfter 2\)`), time.Minute)

			// The same geometry (so the same pool, and the same pages), at
			// full speed.
			next := startCLI(t, env, append(append([]string{"prefill", "--decode", addr}, writes...), append(streaming[:len(streaming)-2:len(streaming)-2], "--layer-us-per-ktok", "0")...)...)
			nextErr := next.wait(t, 3*time.Minute)
			decErr := dec.wait(t, time.Minute)
			if !tc.direct {
				require.NoError(t, nextErr, "prefill:\n%s\n%s", next.out(), next.errOut())
				assert.Contains(t, next.out(), "bytes equal: true")
				assert.NotContains(t, dec.errOut(), "access could not be revoked")
				assert.Regexp(t, `decode: served 2 sessions \(1 complete, 1 lost\)`, dec.out())
				require.Error(t, decErr, "one of its 2 sessions was lost")
				return
			}
			require.Error(t, nextErr, "the next prefill names pages kept out for good")
			assert.Contains(t, dec.errOut(), "its prefill's access could not be revoked", "the lost prefill's rooms are not quiesced")
			assert.Contains(t, next.out()+next.errOut(), "kept out for good")
			require.Error(t, decErr)
		})
	}
}

// TestUCXPrefillSaysWhy: every way a prefill fails to open its session
// with a decode process is an error that says what happened, in seconds:
// nothing listening, TLS on one side only, a decode certificate without
// --decode-name, a prefill the decode does not serve. A prefill started
// before its decode (--connect-timeout) gets its session once the decode
// listens, and completes byte-equal.
func TestUCXPrefillSaysWhy(t *testing.T) {
	t.Parallel()
	dir := devCerts(t)
	env := []string{"UCX_TLS=tcp"}
	oneRequest := []string{"--model", "small", "--requests", "1", "--prompt-tokens", "512", "--chunk-tokens", "512", "--page-size", "16"}
	fails := func(want string, args ...string) {
		t.Helper()
		pre := startCLI(t, env, append(append([]string{"prefill"}, args...), oneRequest...)...)
		start := time.Now()
		require.Error(t, pre.wait(t, time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
		assert.Contains(t, pre.errOut(), want)
		assert.NotContains(t, pre.errOut(), "future: timeout", "a refusal is an answer, not a timeout")
		t.Logf("%q after %v", want, time.Since(start).Round(time.Millisecond))
	}
	fails("nothing listening at", "--decode", nettest.Refusing(t), "--connect-timeout", "0")
	fails("within --connect-timeout 300ms", "--decode", nettest.Refusing(t), "--connect-timeout", "300ms")
	metrics := httptest.NewServer(http.NotFoundHandler())
	defer metrics.Close()
	fails("answered HTTP, not the control plane: is it a metrics port (--metrics-addr)?", "--decode", strings.TrimPrefix(metrics.URL, "http://"))

	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--tls-dir", dir, "--prefill-name", "prefill", "--sessions", "1", "--wait", "3m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	fails("speaks TLS, and this node runs in the clear", "--decode", addr)
	fails(`presented a certificate for "decode", not "decode-x"`, "--decode", addr, "--tls-dir", dir, "--decode-name", "decode-x")
	fails(`peer "rogue" is not a prefill this decode server serves`, "--decode", addr, "--tls-ca", filepath.Join(dir, "ca.pem"),
		"--tls-cert", filepath.Join(dir, "rogue.pem"), "--tls-key", filepath.Join(dir, "rogue.key"))
	pre := startCLI(t, env, append([]string{"prefill", "--decode", addr, "--tls-dir", dir}, oneRequest...)...)
	requireServedOnce(t, dec, pre)

	// The prefill first, the decode on the address it dials once the
	// prefill was refused there and said it retries (at DEBUG, hence
	// --verbose): its first attempt certainly came before the decode
	// listened. The port is held, for the decode's listener only, so that
	// no other process, the prefill's own node included, is given it.
	later := nettest.ListenLater(t)
	pre = startCLI(t, env, append([]string{"prefill", "--decode", later, "--connect-timeout", "1m", "--verbose"}, oneRequest...)...)
	retrying := regexp.MustCompile(`decode server not ready: retrying.*` + regexp.QuoteMeta(later))
	// Polled: the lines channel drops lines when full, the output does not.
	for deadline := time.After(2 * time.Minute); !retrying.MatchString(pre.errOut()); {
		select {
		case <-pre.done:
			t.Fatalf("the prefill ended before it retried: %v\nstdout:\n%s\nstderr:\n%s", pre.err, pre.out(), pre.errOut())
		case <-deadline:
			t.Fatalf("the prefill did not say it retries; stderr:\n%s", pre.errOut())
		case <-time.After(10 * time.Millisecond):
		}
	}
	dec = startCLI(t, env, "decode", "--listen", later, "--sessions", "1", "--wait", "3m")
	requireServedOnce(t, dec, pre)
}

// requireServedOnce: the prefill and the decode both exit 0, bytes equal.
func requireServedOnce(t *testing.T, dec, pre *cli) {
	t.Helper()
	require.NoError(t, pre.wait(t, 2*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	require.NoError(t, dec.wait(t, time.Minute), "decode:\n%s\n%s", dec.out(), dec.errOut())
	assert.Contains(t, pre.out(), "bytes equal: true")
	assert.Regexp(t, `decode: served 1 sessions \(1 complete\)`, dec.out())
}

// TestUCXDecodeServesMetrics: a long-lived `kvstream decode
// --metrics-addr` serves one prefill, is scraped (every kvstream_decode_
// family of docs/OBSERVABILITY.md with its labels, a session counted
// complete, its bytes verified) and answers /healthz and /readyz; SIGTERM
// then drains it: /readyz is not asked again (the process stops), it
// prints its summary and exits 0.
func TestUCXDecodeServesMetrics(t *testing.T) {
	t.Parallel()
	doc, err := metricsdoc.Doc(observability, "The decode server")
	require.NoError(t, err)
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	// Each line is waited for on its own stream: lines of stdout and
	// stderr reach the lines channel in either order.
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	serving := regexp.MustCompile(`serving metrics at http://(\S+)/metrics`)
	require.Eventually(t, func() bool { return serving.MatchString(dec.errOut()) }, 30*time.Second, 10*time.Millisecond, "stderr: %s", dec.errOut())
	ops := serving.FindStringSubmatch(dec.errOut())[1]
	ready, err := httpGet("http://" + ops + "/readyz")
	require.NoError(t, err)
	assert.Equal(t, 200, ready, "ready: taking sessions")
	pre := startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "2", "--prompt-tokens", "1024",
		"--chunk-tokens", "1024", "--page-size", "16", "--no-progress")
	require.NoError(t, pre.wait(t, 2*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	dec.waitLine(t, regexp.MustCompile(`session of .* ended complete`), time.Minute)

	body, err := scrape(ops)
	require.NoError(t, err)
	served, err := metricsdoc.Scrape(body)
	require.NoError(t, err)
	assert.Empty(t, metricsdoc.Compare(doc, served, []string{"kvstream_decode_"}), "docs/OBSERVABILITY.md and a scrape of kvstream decode differ")
	assert.Contains(t, body, `kvstream_decode_sessions_total{outcome="complete"} 1`)
	assert.Contains(t, body, `kvstream_decode_rooms_total{outcome="complete"} 2`)
	assert.Contains(t, body, `kvstream_decode_refused_total{message="hello",reason="identity_busy"} 0`)
	assert.Regexp(t, `kvstream_decode_verified_bytes_total [1-9]`, body)
	assert.Regexp(t, `kvstream_build_info\{commit="[^"]+",goversion="go[^"]+",protocol="`+strconv.Itoa(int(decode.ProtocolVersion))+`",ucx="\d+\.\d+\.\d+",version="[^"]+"\} 1`, body,
		"the decode says which build it runs")
	healthy, err := httpGet("http://" + ops + "/healthz")
	require.NoError(t, err)
	assert.Equal(t, 200, healthy)

	require.NoError(t, dec.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, dec.wait(t, time.Minute), "a drain that cut nothing exits 0:\n%s\n%s", dec.out(), dec.errOut())
	assert.Regexp(t, `decode: served 1 sessions \(1 complete\)`, dec.out())
}

// TestUCXPrefillDrains: kvstream prefill serves its engine's metrics and
// is ready while its session is open; a SIGTERM mid-run starts no other
// request, finishes those started, says goodbye, prints what it did and
// exits 0; the decode side sees a complete session.
func TestUCXPrefillDrains(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "3m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	// 64 forwards of 80 ms: seconds of work left when the signal comes.
	pre := startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "16", "--prompt-tokens", "4096",
		"--chunk-tokens", "1024", "--page-size", "16", "--layer-us-per-ktok", "10000", "--metrics-addr", "127.0.0.1:0")
	ops := pre.waitLine(t, regexp.MustCompile(`serving metrics at http://(\S+)/metrics`), 30*time.Second)[1]
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 2/64 done`), time.Minute)
	ready, err := httpGet("http://" + ops + "/readyz")
	require.NoError(t, err)
	assert.Equal(t, 200, ready, "ready: its session is open")
	// The engine's metrics: a batch is counted when it completed, which a
	// loaded machine may delay past the forward's end.
	posted := regexp.MustCompile(`kvstream_posted_bytes_total\{part="group"\} [1-9]`)
	var body string
	for end := time.Now().Add(30 * time.Second); !posted.MatchString(body) && time.Now().Before(end); {
		body, err = scrape(ops)
		require.NoError(t, err)
	}
	assert.Regexp(t, posted, body, "the engine's metrics")

	require.NoError(t, pre.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, pre.wait(t, time.Minute), "a drain that finished what it started exits 0:\n%s\n%s", pre.out(), pre.errOut())
	m := regexp.MustCompile(`prefill: per-layer over ucx stopped after (\d+) of 64 forwards: (\d+) of 16 requests done \((\d+) not started\), (\d+) chunks done, 0 failed, decode accepted (\d+) chunks, bytes equal: true, .*; drained: \d+ of 16 requests not started`).
		FindStringSubmatch(pre.out())
	require.NotNil(t, m, "prefill:\n%s\n%s", pre.out(), pre.errOut())
	n := func(i int) int { v, err := strconv.Atoi(m[i]); require.NoError(t, err); return v }
	assert.Equal(t, 16, n(2)+n(3), "every request either done or never started")
	assert.Positive(t, n(3), "the drain kept requests from starting")
	assert.Equal(t, 4*n(2), n(4), "four chunks per request done")
	assert.Equal(t, n(4), n(5), "the decode accepted every chunk done")
	assert.Equal(t, n(4), n(1), "one chunk per forward")
	assert.Contains(t, pre.errOut(), "prefill: terminated: draining")
	require.NoError(t, dec.wait(t, time.Minute), "decode:\n%s\n%s", dec.out(), dec.errOut())
	assert.Regexp(t, fmt.Sprintf(`session of .* ended complete: %d chunks \(0 not successful\), %d rooms complete`, n(4), n(2)), dec.out())
}

// httpGet is the status code of a GET (no connection kept: goleak).
func httpGet(url string) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// TestUCXIPv6: a decode and a prefill on IPv6 loopback addresses ([::1]:P
// wherever an address is taken) serve a session byte-equal.
func TestUCXIPv6(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	require.NoError(t, l.Close())
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "[::1]:0", "--sessions", "1", "--wait", "3m", "--metrics-addr", "[::1]:0")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	require.True(t, strings.HasPrefix(addr, "[::1]:"), addr)
	pre := startCLI(t, env, "prefill", "--decode", addr, "--listen", "[::1]:0", "--model", "small", "--requests", "1",
		"--prompt-tokens", "512", "--chunk-tokens", "512", "--page-size", "16", "--no-progress")
	requireServedOnce(t, dec, pre)
}

// TestUCXDrainCutSummaries: a decode whose drain cuts a busy prefill
// (SIGTERM with --drain-timeout 1s) leaves both processes with summaries
// that tell the truth and exit statuses that agree with them: the prefill
// never says "bytes equal: false" when no byte differed; cut, it says
// after how many forwards and that not every chunk was compared, and
// exits non-zero; the decode exits non-zero exactly when it says its
// drain cut sessions.
func TestUCXDrainCutSummaries(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--drain-timeout", "1s")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	pre := startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "64", "--prompt-tokens", "8192",
		"--chunk-tokens", "1024", "--page-size", "16", "--layer-us-per-ktok", "20000")
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 2/\d+ done`), time.Minute)
	require.NoError(t, dec.cmd.Process.Signal(syscall.SIGTERM))
	decErr := dec.wait(t, time.Minute)
	preErr := pre.wait(t, 2*time.Minute)

	summary := regexp.MustCompile(`(?m)^prefill: per-layer over ucx.*$`).FindString(pre.out())
	require.NotEmpty(t, summary, "prefill:\n%s\n%s", pre.out(), pre.errOut())
	assert.NotContains(t, summary, "bytes equal: false", "no byte differed")
	if preErr != nil {
		assert.Regexp(t, `stopped after \d+ of 512 forwards: \d+ of 64 requests done`, summary)
		assert.Contains(t, summary, "bytes equal: not compared for every chunk (none compared differed)")
	} else {
		assert.Contains(t, summary, "bytes equal: true")
	}
	if decErr != nil {
		assert.Contains(t, dec.out(), "cut by the drain timeout")
	} else {
		assert.NotContains(t, dec.out(), "cut by the drain timeout")
	}
}

// TestUCXDecodeDrainsItsPrefill: a SIGTERM to kvstream decode mid-run
// tells its prefill, which starts no other request, finishes those
// started, says goodbye and exits 0 saying the decode drained; the decode
// exits 0 as soon as that session ended, long before its 5-minute
// --drain-timeout, with the session complete.
func TestUCXDecodeDrainsItsPrefill(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--drain-timeout", "5m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	pre := startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "16", "--prompt-tokens", "4096",
		"--chunk-tokens", "1024", "--page-size", "16", "--layer-us-per-ktok", "10000")
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 2/64 done`), time.Minute)
	signalled := time.Now()
	require.NoError(t, dec.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, pre.wait(t, 2*time.Minute), "a prefill whose decode drained, having lost nothing, exits 0:\n%s\n%s", pre.out(), pre.errOut())
	require.NoError(t, dec.wait(t, 2*time.Minute), "a drain that cut nothing exits 0:\n%s\n%s", dec.out(), dec.errOut())
	t.Logf("the decode exited %v after its SIGTERM (--drain-timeout 5m)", time.Since(signalled).Round(time.Millisecond))
	m := regexp.MustCompile(`stopped after \d+ of 64 forwards: (\d+) of 16 requests done \((\d+) not started\), (\d+) chunks done, 0 failed, decode accepted (\d+) chunks, bytes equal: true, .*; decode drained: the decode server decode is draining`).
		FindStringSubmatch(pre.out())
	require.NotNil(t, m, "prefill:\n%s\n%s", pre.out(), pre.errOut())
	n := func(i int) int { v, err := strconv.Atoi(m[i]); require.NoError(t, err); return v }
	assert.Equal(t, 16, n(1)+n(2), "every request either done or never started")
	assert.Positive(t, n(2), "the decode's drain kept requests from starting")
	assert.Equal(t, n(3), n(4), "the decode accepted every chunk done")
	assert.Contains(t, pre.errOut(), "the decode process drains")
	assert.Regexp(t, fmt.Sprintf(`session of .* ended complete: %d chunks \(0 not successful\), %d rooms complete`, n(3), n(1)), dec.out())
	assert.NotContains(t, dec.out(), "cut by the drain timeout")
}
