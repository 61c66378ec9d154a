package keymetrics

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/system"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
)

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
	Print(&out, reg)
	got := out.String()
	assert.Contains(t, got, "batches 6 ok, 1 failed; 4.0 MiB in 0 blocks posted")
	assert.Contains(t, got, "chunks 99 success, 1 failed, 0 dropped; timeouts 1; submitter restarts 2")
	assert.Contains(t, got, "finish p50 ≈ 37.6µs, p99 ≈ 50µs (100 samples)")
	assert.Contains(t, got, "exposed transfer p50 > 10s, max > 10s (1 samples)", "beyond the last bucket is a lower bound")
	assert.Equal(t, 3, strings.Count(got, "\n"), got)

	out.Reset()
	var typed *prometheus.Registry
	Print(&out, nil)
	Print(&out, typed)
	Print(&out, prometheus.NewRegistry())
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
		got, ok := BucketQuantile(tc.p, bounds, tc.counts, tc.n)
		assert.InDelta(t, tc.want, got, 1e-9, "%+v", tc)
		assert.Equal(t, tc.ok, ok, "%+v", tc)
	}
}
