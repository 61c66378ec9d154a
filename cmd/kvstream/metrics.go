package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/system"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/cobra"
)

// metricsFlags are --metrics-addr and --metrics-linger of a command that
// runs engines.
type metricsFlags struct {
	cmd    *cobra.Command
	addr   string
	linger time.Duration
	// bound is where the server listens once start returned: the real port
	// when --metrics-addr asked for port 0.
	bound string
}

// shutdownGrace bounds how long stop waits for scrapes in progress.
const shutdownGrace = 5 * time.Second

func addMetricsFlags(cmd *cobra.Command) *metricsFlags {
	m := &metricsFlags{cmd: cmd}
	fl := cmd.Flags()
	fl.StringVar(&m.addr, "metrics-addr", "",
		"serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 (empty: no metrics)")
	fl.DurationVar(&m.linger, "metrics-linger", 0,
		"keep serving metrics this long after the work ended, so that a scraper sees a short run (Ctrl-C ends it early)")
	return m
}

// start serves a fresh registry (with the Go and process collectors) on
// --metrics-addr. Without an address it returns a nil registry, which
// system.WithMetrics takes as "off", and a stop that does nothing. stop is
// never nil, so it may be deferred before err is checked; it waits
// --metrics-linger, then shuts the server down and returns once its
// goroutine ended. It may be called more than once.
func (m *metricsFlags) start() (reg *prometheus.Registry, stop func(), err error) {
	stop = func() {}
	if m.addr == "" {
		return nil, stop, nil
	}
	// Listen here rather than in the server's goroutine: a bad or busy
	// address fails the command at once instead of after the work.
	ln, err := net.Listen("tcp", m.addr)
	if err != nil {
		return nil, stop, errors.Wrapf(err, "--metrics-addr %q", m.addr)
	}
	m.bound = ln.Addr().String()
	reg = prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.InstrumentMetricHandler(reg,
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorHandling: promhttp.ContinueOnError})))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln) // http.ErrServerClosed after Shutdown
	}()
	out := m.errOut()
	fmt.Fprintf(out, "kvstream: serving metrics at http://%s/metrics\n", m.bound)

	var once sync.Once
	stop = func() {
		once.Do(func() {
			if m.linger > 0 {
				fmt.Fprintf(out, "kvstream: serving metrics for %v more (Ctrl-C to stop)\n", m.linger)
				m.waitLinger()
			}
			ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
			defer cancel()
			if srv.Shutdown(ctx) != nil {
				_ = srv.Close() // a scrape outlived the grace: cut it
			}
			<-served
		})
	}
	return reg, stop, nil
}

func (m *metricsFlags) errOut() io.Writer {
	if m.cmd != nil {
		return m.cmd.ErrOrStderr()
	}
	return os.Stderr
}

func (m *metricsFlags) waitLinger() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	t := time.NewTimer(m.linger)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// printKeyMetrics prints the figures an operator checks first after a run:
// batches and bytes, chunk outcomes, timeouts, restarts and the finish and
// exposed-transfer quantiles. Quantiles are estimated from the histogram
// buckets the way PromQL's histogram_quantile does, so they match a
// dashboard, not the exact sample. It prints nothing when g is nil or holds
// no kvstream figures.
func printKeyMetrics(w io.Writer, g prometheus.Gatherer) {
	if g == nil {
		return
	}
	if v := reflect.ValueOf(g); v.Kind() == reflect.Pointer && v.IsNil() {
		return
	}
	mfs, err := g.Gather()
	if err != nil && len(mfs) == 0 {
		fmt.Fprintf(w, "metrics: %v\n", err)
		return
	}
	fam := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		fam[mf.GetName()] = mf
	}
	if fam[system.MetricBatches] == nil && fam[system.MetricChunks] == nil {
		return
	}
	fmt.Fprintf(w, "metrics: batches %.0f ok, %.0f failed; %s in %.0f blocks posted\n",
		metricSum(fam[system.MetricBatches], "result", "ok"), metricSum(fam[system.MetricBatches], "result", "failed"),
		metricBytes(metricSum(fam[system.MetricPostedBytes], "", "")), metricSum(fam[system.MetricPostedBlocks], "", ""))
	fmt.Fprintf(w, "metrics: chunks %.0f success, %.0f failed, %.0f dropped; timeouts %.0f; submitter restarts %.0f\n",
		metricSum(fam[system.MetricChunks], "status", "success"), metricSum(fam[system.MetricChunks], "status", "failed"),
		metricSum(fam[system.MetricChunks], "status", "dropped"), metricSum(fam[system.MetricTimeouts], "", ""),
		metricSum(fam[system.MetricSubmitterRestarts], "", ""))
	fmt.Fprintf(w, "metrics: finish %s; exposed transfer %s\n",
		metricQuantiles(fam[system.MetricFinishSeconds], "", ""), metricQuantiles(fam[system.MetricExposedTransfer], "", ""))
	if mf := fam[system.MetricExposedPhase]; mf != nil {
		fmt.Fprintf(w, "metrics: exposed phases: detect %s; post %s; land %s; finish %s\n",
			metricQuantiles(mf, "phase", "detect"), metricQuantiles(mf, "phase", "post"),
			metricQuantiles(mf, "phase", "land"), metricQuantiles(mf, "phase", "finish"))
	}
	if err != nil {
		fmt.Fprintf(w, "metrics: (partial: %v)\n", err)
	}
}

// metricSum adds up the counter or gauge series of mf whose label name has value
// (every series when name is empty).
func metricSum(mf *dto.MetricFamily, name, value string) float64 {
	var s float64
	for _, m := range mf.GetMetric() {
		if name != "" && !metricHasLabel(m, name, value) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			s += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			s += m.GetGauge().GetValue()
		}
	}
	return s
}

func metricHasLabel(m *dto.Metric, name, value string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue() == value
		}
	}
	return false
}

// metricQuantiles returns "p50 ≈ X, p99 ≈ Y (n samples)" for a histogram family,
// merging its series whose label name has value (every series when name is
// empty; they share kvstream's buckets). Under 100 samples a p99 is the
// maximum, and the buckets only bound it: "max ≤ Y".
func metricQuantiles(mf *dto.MetricFamily, name, value string) string {
	var n uint64
	cum := map[float64]uint64{}
	var bounds []float64
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		if h == nil || (name != "" && !metricHasLabel(m, name, value)) {
			continue
		}
		n += h.GetSampleCount()
		for _, b := range h.GetBucket() {
			ub := b.GetUpperBound()
			if _, ok := cum[ub]; !ok {
				bounds = append(bounds, ub)
			}
			cum[ub] += b.GetCumulativeCount()
		}
	}
	if n == 0 {
		return "no samples"
	}
	// Series of one family share their bounds, in increasing order.
	counts := make([]uint64, len(bounds))
	for i, ub := range bounds {
		counts[i] = cum[ub]
	}
	q := func(p float64) string {
		s, ok := bucketQuantile(p, bounds, counts, n)
		if !ok {
			return "> " + metricDuration(s)
		}
		return "≈ " + metricDuration(s)
	}
	if n < 100 {
		top, ok := bucketQuantile(1, bounds, counts, n)
		tail := "≤ " + metricDuration(top)
		if !ok {
			tail = "> " + metricDuration(top)
		}
		return fmt.Sprintf("p50 %s, max %s (%d samples)", q(0.5), tail, n)
	}
	return fmt.Sprintf("p50 %s, p99 %s (%d samples)", q(0.5), q(0.99), n)
}

// bucketQuantile interpolates linearly inside the bucket that holds rank
// p·n, as histogram_quantile does. ok is false when the rank lies beyond the
// last finite bound: then the value is that bound, a lower limit.
func bucketQuantile(p float64, bounds []float64, counts []uint64, n uint64) (v float64, ok bool) {
	rank := p * float64(n)
	lower, below := 0.0, uint64(0)
	for i, ub := range bounds {
		if math.IsInf(ub, 1) {
			break
		}
		if float64(counts[i]) >= rank {
			in := counts[i] - below
			if in == 0 {
				return ub, true
			}
			return lower + (ub-lower)*(rank-float64(below))/float64(in), true
		}
		lower, below = ub, counts[i]
	}
	return lower, false
}

// metricDuration prints seconds with three significant digits in the unit
// that suits them: bucket estimates carry no more precision than that.
func metricDuration(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.3gs", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3gms", s*1e3)
	}
	return fmt.Sprintf("%.3gµs", s*1e6)
}

func metricBytes(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
