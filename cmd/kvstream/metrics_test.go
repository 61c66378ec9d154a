package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvstream/kvstream/system"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

	start := time.Now()
	stop()
	assert.Less(t, time.Since(start), time.Second, "no linger: stop is prompt")
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

func TestPrintKeyMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	batches := prometheus.NewCounterVec(prometheus.CounterOpts{Name: system.MetricBatches, Help: "h"}, []string{"result"})
	bytesPosted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: system.MetricPostedBytes, Help: "h"}, []string{"part"})
	chunks := prometheus.NewCounterVec(prometheus.CounterOpts{Name: system.MetricChunks, Help: "h"}, []string{"status"})
	restarts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: system.MetricSubmitterRestarts, Help: "h"}, []string{"reason"})
	timeouts := prometheus.NewCounter(prometheus.CounterOpts{Name: system.MetricTimeouts, Help: "h"})
	finish := prometheus.NewHistogram(prometheus.HistogramOpts{Name: system.MetricFinishSeconds, Help: "h", Buckets: system.DurationBuckets})
	exposed := prometheus.NewHistogram(prometheus.HistogramOpts{Name: system.MetricExposedTransfer, Help: "h", Buckets: system.DurationBuckets})
	reg.MustRegister(batches, bytesPosted, chunks, restarts, timeouts, finish, exposed)
	batches.WithLabelValues("ok").Add(6)
	batches.WithLabelValues("failed").Add(1)
	bytesPosted.WithLabelValues("group").Add(3 << 20)
	bytesPosted.WithLabelValues("rest").Add(1 << 20)
	chunks.WithLabelValues("success").Add(99)
	chunks.WithLabelValues("failed").Add(1)
	restarts.WithLabelValues("endpoint").Add(2)
	timeouts.Inc()
	// 99 finishes in (25 µs, 50 µs], one at 20 s: p99 is the top of the
	// first bucket, p50 is interpolated inside it.
	for range 99 {
		finish.Observe(30e-6)
	}
	finish.Observe(20)
	exposed.Observe(20)

	var out bytes.Buffer
	printKeyMetrics(&out, reg)
	got := out.String()
	assert.Contains(t, got, "batches 6 ok, 1 failed; 4.0 MiB in 0 blocks posted")
	assert.Contains(t, got, "chunks 99 success, 1 failed, 0 dropped; timeouts 1; submitter restarts 2")
	assert.Contains(t, got, "finish p50 ≈ 37.6µs, p99 ≈ 50µs (100 samples)")
	assert.Contains(t, got, "exposed transfer p50 > 10s, max > 10s (1 samples)", "beyond the last bucket is a lower bound")
	assert.Equal(t, 3, strings.Count(got, "\n"), got)

	out.Reset()
	var typed *prometheus.Registry
	printKeyMetrics(&out, nil)
	printKeyMetrics(&out, typed)
	printKeyMetrics(&out, prometheus.NewRegistry())
	assert.Empty(t, out.String(), "nothing to say without kvstream figures")
}

func TestBucketQuantile(t *testing.T) {
	bounds := []float64{1, 2, 4}
	for _, tc := range []struct {
		p      float64
		counts []uint64
		n      uint64
		want   float64
		ok     bool
	}{
		{0.5, []uint64{0, 10, 10}, 10, 1.5, true},  // inside (1, 2]
		{0.99, []uint64{5, 5, 10}, 10, 3.96, true}, // empty bucket skipped
		{0.5, []uint64{10, 10, 10}, 10, 0.5, true}, // first bucket from 0
		{0.99, []uint64{0, 0, 5}, 10, 4, false},    // in +Inf
	} {
		got, ok := bucketQuantile(tc.p, bounds, tc.counts, tc.n)
		assert.InDelta(t, tc.want, got, 1e-9, "%+v", tc)
		assert.Equal(t, tc.ok, ok, "%+v", tc)
	}
}
