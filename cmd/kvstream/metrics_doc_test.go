package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvstream/kvstream/lab/metricsdoc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// observability is the page the metrics must match.
var observability = filepath.Join("..", "..", "docs", "OBSERVABILITY.md")

// TestObservabilityMatchesAScrape: `kvstream sim --metrics-addr`, a real
// process, scraped over HTTP once its run ended: every kvstream_ family it
// serves is in docs/OBSERVABILITY.md's table with its type, labels and
// label values (no undocumented label, such as the `run` the sim once
// added), every documented value has a series (registrations refused by
// each of the eight reasons at 0), and every documented family is served,
// but for the five gauges computed from open engines, which the page
// says are not reported once none is open.
func TestObservabilityMatchesAScrape(t *testing.T) {
	doc, err := metricsdoc.Doc(observability, "Metrics")
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], append(append([]string{}, quick...), "--metrics-addr", "127.0.0.1:0", "--metrics-linger", "2m")...)
	cmd.Env = append(os.Environ(), cliMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	addr := make(chan string, 1)
	lingering := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		serving := regexp.MustCompile(`serving metrics at http://(\S+)/metrics`)
		for sc.Scan() {
			if m := serving.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
			if strings.Contains(sc.Text(), "more (Ctrl-C to stop)") {
				close(lingering)
			}
		}
		done <- cmd.Wait()
	}()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGINT) // ends the linger
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	a := <-addr
	select {
	case <-lingering:
	case <-time.After(2 * time.Minute):
		t.Fatal("the sim did not end within 2 minutes")
	}
	body, err := scrape(a)
	require.NoError(t, err)
	served, err := metricsdoc.Scrape(body)
	require.NoError(t, err)
	diffs := metricsdoc.Compare(doc, served, []string{"kvstream_"}, "kvstream_active_contexts", "kvstream_rooms_in_flight", "kvstream_bytes_in_flight", "kvstream_submit_queue_depth", "kvstream_healthy")
	assert.Empty(t, diffs, "docs/OBSERVABILITY.md and a scrape of kvstream sim differ")
	assert.Equal(t, []string{"bad_input", "cancelled", "closed", "peer_draining", "peer_lost", "peer_removed", "room_cancelled", "unhealthy"}, served["kvstream_registrations_refused_total"].Labels["reason"])
	assert.NotContains(t, body, `run="`, "no label the documentation does not list")
	if promtool, err := exec.LookPath("promtool"); err == nil {
		lint := exec.Command(promtool, "check", "metrics")
		lint.Stdin = strings.NewReader(body)
		out, err := lint.CombinedOutput()
		var kv []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "kvstream_") {
				kv = append(kv, l)
			}
		}
		assert.Empty(t, kv, "promtool check metrics on kvstream's families (exit %v)", err)
	}
}
