package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/kvstream/kvstream/lab/buildinfo"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

func metricsCommand(t *testing.T, args ...string) (*metricsFlags, *bytes.Buffer) {
	t.Helper()
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	var errOut bytes.Buffer
	cmd.SetErr(&errOut)
	mf := addMetricsFlags(cmd)
	require.NoError(t, cmd.ParseFlags(args))
	return mf, &errOut
}

// scrape fetches /metrics without keeping the connection: a pooled
// connection's goroutines would outlive the test (goleak).
func scrape(addr string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = &statusError{resp.StatusCode}
	}
	return string(body), err
}

type statusError struct{ code int }

func (e *statusError) Error() string { return http.StatusText(e.code) }

func TestMetricsServeThenStop(t *testing.T) {
	mf, errOut := metricsCommand(t, "--metrics-addr", "127.0.0.1:0")
	reg, stop, err := mf.start()
	require.NoError(t, err)
	defer stop()
	require.NotNil(t, reg)
	require.NotEqual(t, "127.0.0.1:0", mf.bound, "the bound address names the real port")

	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstream_test_total", Help: "A test counter."})
	reg.MustRegister(c)
	c.Add(3)
	body, err := scrape(mf.bound)
	require.NoError(t, err)
	assert.Contains(t, body, "kvstream_test_total 3")
	assert.Contains(t, body, "go_goroutines", "the Go collector is registered")
	assert.Contains(t, body, "process_", "the process collector is registered")
	assert.Contains(t, errOut.String(), "serving metrics at http://"+mf.bound+"/metrics")

	// No linger by default: stop says nothing of one and does not wait
	// one out. A stop that waited, for a linger or for a scrape to end
	// (the shutdown grace), takes at least shutdownGrace; a prompt one
	// takes milliseconds, so only a machine starved for seconds could
	// fail this bound wrongly.
	start := time.Now()
	stop()
	took := time.Since(start)
	assert.NotContains(t, errOut.String(), "serving metrics for", "no linger unless --metrics-linger asks")
	assert.Less(t, took, shutdownGrace, "no linger: stop is prompt")
	_, err = scrape(mf.bound)
	assert.Error(t, err, "the server is gone after stop")
	stop() // idempotent
}

func TestMetricsLingerKeepsServing(t *testing.T) {
	const linger = 400 * time.Millisecond
	mf, errOut := metricsCommand(t, "--metrics-addr", "127.0.0.1:0", "--metrics-linger", linger.String())
	_, stop, err := mf.start()
	require.NoError(t, err)

	start := time.Now()
	stopped := make(chan time.Duration)
	go func() {
		stop()
		stopped <- time.Since(start)
	}()
	_, err = scrape(mf.bound)
	require.NoError(t, err, "a scraper still sees the run while it lingers")
	took := <-stopped
	assert.GreaterOrEqual(t, took, linger)
	assert.Less(t, took, linger+5*time.Second)
	assert.Contains(t, errOut.String(), "serving metrics for 400ms more")
	_, err = scrape(mf.bound)
	assert.Error(t, err)
}

func TestMetricsOffAndBadAddress(t *testing.T) {
	mf, errOut := metricsCommand(t)
	reg, stop, err := mf.start()
	require.NoError(t, err)
	assert.Nil(t, reg, "no address, no registry: system.WithMetrics(nil) is off")
	require.NotNil(t, stop)
	stop()
	assert.Empty(t, errOut.String())

	mf, _ = metricsCommand(t, "--metrics-addr", "127.0.0.1:0")
	_, stopFirst, err := mf.start()
	require.NoError(t, err)
	defer stopFirst()
	for _, addr := range []string{mf.bound, "127.0.0.1:notaport"} {
		other, _ := metricsCommand(t, "--metrics-addr", addr)
		reg, stop, err := other.start()
		require.Error(t, err, addr)
		assert.Contains(t, err.Error(), "--metrics-addr")
		assert.Nil(t, reg)
		require.NotNil(t, stop, "stop may be deferred before err is checked")
		stop()
	}
}

// TestOpsEndpointServesBuildInfo: the operations endpoint of every
// long-running command (decode, prefill, up and its nodes) serves
// kvstream_build_info, whose labels say which build runs.
func TestOpsEndpointServesBuildInfo(t *testing.T) {
	cmd := &cobra.Command{Use: "x"}
	var errOut bytes.Buffer
	cmd.SetErr(&errOut)
	of := opsFlags{addr: "127.0.0.1:0", drain: time.Second}
	ops, err := of.start(cmd, zap.NewNop())
	require.NoError(t, err)
	defer func() { assert.NoError(t, ops.Close(context.Background())) }()
	body, err := scrape(ops.Addr())
	require.NoError(t, err)
	in := buildinfo.Read()
	assert.Contains(t, body, fmt.Sprintf(`kvstream_build_info{commit=%q,goversion=%q,protocol="%d",ucx=`, in.Commit, in.GoVersion, in.Protocol))
	assert.Contains(t, body, fmt.Sprintf(`version=%q} 1`, in.Version))
}
