package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/lab/buildinfo"
	"github.com/kvstream/kvstream/lab/keymetrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	if err := m.check(); err != nil {
		return nil, stop, err
	}
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
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Read().Collector())
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

// check refuses a negative --metrics-linger, and a linger without
// --metrics-addr (nothing would be served while the command waits).
func (m *metricsFlags) check() error {
	switch {
	case m.linger < 0:
		return errors.Newf("--metrics-linger %v: must not be negative (0: stop serving when the work ends)", m.linger)
	case m.linger > 0 && m.addr == "":
		return errors.Newf("--metrics-linger %v: needs --metrics-addr (there is no metrics server to keep serving)", m.linger)
	}
	return nil
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

// printKeyMetrics prints a run's key figures (keymetrics.Print) under the
// name the commands call it by.
func printKeyMetrics(w io.Writer, g prometheus.Gatherer) { keymetrics.Print(w, g) }
