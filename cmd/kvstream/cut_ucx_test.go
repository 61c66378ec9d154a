//go:build ucx

package main

import (
	"errors"
	"net"
	"os/exec"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cutBound is how soon a command must exit after its second signal: far
// below what it was waiting for (a 10-minute connect timeout, a 9-minute
// pause of etcd), generous for a busy machine.
const cutBound = 10 * time.Second

// silentListener accepts TCP connections and never answers on them: a
// decode address where a prefill's Hello is never answered. accepted is
// closed at the first connection.
func silentListener(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	first := make(chan struct{})
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		var once sync.Once
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			once.Do(func() { close(first) })
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String(), first
}

// requireCut checks that c exited within cutBound of its second signal,
// non-zero, saying it was cut by that signal after the first.
func requireCut(t *testing.T, c *cli, second syscall.Signal, signalled time.Time) {
	t.Helper()
	err := c.wait(t, cutBound)
	took := time.Since(signalled)
	t.Logf("exited %v after the second signal", took.Round(time.Millisecond))
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "a non-zero exit, not %v; stdout:\n%s\nstderr:\n%s", err, c.out(), c.errOut())
	assert.NotZero(t, exit.ExitCode())
	assert.Contains(t, c.errOut(), "cut by a second stop ("+second.String()+", after terminated)")
}

// TestUCXPrefillSecondSignalCutsTheConnect: a prefill still connecting to
// a decode address that accepts and never answers (with a 10-minute
// --connect-timeout) drains at its first signal and exits at once at the
// second, SIGTERM or SIGINT, saying it was cut. It once ignored both
// until its connect timeout ran out.
func TestUCXPrefillSecondSignalCutsTheConnect(t *testing.T) {
	t.Parallel()
	for _, second := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(second.String(), func(t *testing.T) {
			addr, accepted := silentListener(t)
			c := startCLI(t, []string{"UCX_TLS=tcp"}, "prefill", "--decode", addr, "--connect-timeout", "10m",
				"--model", "small", "--requests", "1", "--prompt-tokens", "256", "--chunk-tokens", "256", "--page-size", "16", "--no-progress")
			select {
			case <-accepted:
			case <-c.done:
				t.Fatalf("prefill exited before connecting: %v\n%s\n%s", c.err, c.out(), c.errOut())
			case <-time.After(time.Minute):
				t.Fatalf("prefill did not connect within a minute\n%s\n%s", c.out(), c.errOut())
			}
			require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
			c.waitLine(t, regexp.MustCompile(`^prefill: terminated: draining`), 30*time.Second)
			require.NoError(t, c.cmd.Process.Signal(second))
			requireCut(t, c, second, time.Now())
			assert.Contains(t, c.errOut(), "dial the decode server at "+addr)
		})
	}
}

// TestUCXClusterUpSecondSignalCutsAFaultsPause: `up` waiting out a
// 9-minute pause-etcd fault (its drain given 5 minutes) drains at its
// first signal and exits at once at the second, SIGTERM or SIGINT: etcd
// is resumed, every node is cut and exits by itself, and up says it was
// cut. It once ignored every signal until the pause ended.
func TestUCXClusterUpSecondSignalCutsAFaultsPause(t *testing.T) {
	clusterAtATime(t)
	for _, second := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(second.String(), func(t *testing.T) {
			c := startCLI(t, []string{"UCX_TLS=tcp"}, "up", "--model", "small", "--page-size", "16", "--requests", "1",
				"--prompt-tokens", "256", "--chunk-tokens", "256", "--prefill-ranks", "1", "--decode", "1", "--batches", "2",
				"--fault", "pause-etcd", "--fault-batch", "1", "--fault-for", "9m", "--drain-timeout", "5m")
			c.waitLine(t, regexp.MustCompile(`^up: pause-etcd: etcd frozen for 9m0s`), 2*time.Minute)
			require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
			c.waitLine(t, regexp.MustCompile(`^up: draining \(terminated\)`), 30*time.Second)
			require.NoError(t, c.cmd.Process.Signal(second))
			requireCut(t, c, second, time.Now())
			// Each node honours its own cut (a decode instance once
			// waited for its rank's session past it).
			assert.NotContains(t, c.errOut(), "after its cut: SIGKILL")
			assert.Contains(t, c.out(), "into the pause (cut by a second stop ("+second.String()+", after terminated)): etcd resumed", "the report")
		})
	}
}
