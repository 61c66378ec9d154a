package service

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Check is one named condition of liveness or readiness: nil when it
// holds, else why not. It runs on the scraper's request, so it must be
// cheap (read state, never call a remote peer) and return within ctx.
type Check func(ctx context.Context) error

// Config configures Start.
type Config struct {
	// Addr is where /metrics, /healthz and /readyz are served (host:port;
	// port 0 picks one). Empty serves nothing: the checks still run for
	// Readiness, and Registry still collects (for a final report).
	Addr string
	// Registry is the registry /metrics serves; nil: a fresh one with the
	// Go and process collectors.
	Registry *prometheus.Registry
	// Log receives the server's own failures (WARN) and the drain's
	// progress; nil logs nothing.
	Log *zap.Logger
	// ShutdownGrace bounds how long Close waits for requests in progress
	// (DefaultShutdownGrace when zero).
	ShutdownGrace time.Duration
	// CheckTimeout bounds each request's checks together
	// (DefaultCheckTimeout when zero).
	CheckTimeout time.Duration
}

// Defaults for Config's zero fields.
const (
	DefaultShutdownGrace = 5 * time.Second
	DefaultCheckTimeout  = 2 * time.Second
)

// Ops is a command's operations endpoint. Its methods are safe for
// concurrent use.
type Ops struct {
	cfg   Config
	reg   *prometheus.Registry
	log   *zap.Logger
	srv   *http.Server
	bound string
	done  chan struct{} // the server's goroutine ended

	mu        sync.Mutex
	live      []named
	ready     []named
	draining  atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

type named struct {
	name  string
	check Check
}

// Start listens on cfg.Addr (before returning: a bad or busy address is an
// error naming it) and serves:
//
//   - /metrics: cfg.Registry in the Prometheus text format;
//   - /healthz: 200 "ok" while the process works (every Live check
//     passes), 503 with the failing checks otherwise;
//   - /readyz: 200 "ok" while the command accepts work (every Ready check
//     passes and the drain has not begun), 503 with the reasons otherwise;
//     ?verbose lists every check. Until the command added its first Ready
//     check it is starting, not ready: a command serves its endpoint
//     before it registered or serves (which may take a member TTL or a
//     cluster's start), and a load balancer must not send it work then.
func Start(cfg Config) (*Ops, error) {
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = DefaultCheckTimeout
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	o := &Ops{cfg: cfg, reg: reg, log: log, done: make(chan struct{})}
	if cfg.Addr == "" {
		close(o.done)
		return o, nil
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, errors.Wrapf(err, "--metrics-addr %q", cfg.Addr)
	}
	o.bound = ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.InstrumentMetricHandler(reg,
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorHandling: promhttp.ContinueOnError})))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { o.answer(w, r, o.checks(false), false) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		o.answer(w, r, o.checks(true), o.draining.Load())
	})
	o.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(o.done)
		if err := o.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("operations endpoint stopped", zap.String("addr", o.bound), zap.String("error", err.Error()))
		}
	}()
	return o, nil
}

// Addr is the address the endpoint listens on (the real port when
// Config.Addr asked for port 0), or "" when it serves nothing.
func (o *Ops) Addr() string { return o.bound }

// Registry is the registry /metrics serves (never nil).
func (o *Ops) Registry() *prometheus.Registry { return o.reg }

// Registerer is Registry, or nil when nothing is served: pass it to
// system.WithMetrics, which takes nil as "no metrics".
func (o *Ops) Registerer() prometheus.Registerer {
	if o.bound == "" {
		return nil
	}
	return o.reg
}

// Live adds a liveness check: /healthz fails while it fails. Use it only
// for what a restart would cure (a wedged loop), never for a peer's state.
func (o *Ops) Live(name string, c Check) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.live = append(o.live, named{name, c})
}

// Ready adds a readiness check: /readyz fails while it fails.
func (o *Ops) Ready(name string, c Check) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ready = append(o.ready, named{name, c})
}

// SetDraining makes /readyz fail from now on ("draining"): the first step
// of a drain, so that load balancers and routers stop sending work.
func (o *Ops) SetDraining() { o.draining.Store(true) }

// Draining reports whether SetDraining was called.
func (o *Ops) Draining() bool { return o.draining.Load() }

// result is one check's outcome.
type result struct {
	name string
	err  error
}

func (o *Ops) checks(ready bool) []result {
	o.mu.Lock()
	list := o.live
	if ready {
		list = o.ready
	}
	list = append([]named(nil), list...)
	o.mu.Unlock()
	if ready && len(list) == 0 {
		return []result{{"starting", errors.New("no readiness check yet: the command has not come up")}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.cfg.CheckTimeout)
	defer cancel()
	out := make([]result, len(list))
	for i, n := range list {
		out[i] = result{n.name, runCheck(ctx, n)}
	}
	return out
}

// runCheck runs one check; a panic is its failure, not the process's.
func runCheck(ctx context.Context, n named) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = errors.Newf("check %s panicked: %v", n.name, p)
		}
	}()
	return n.check(ctx)
}

// Readiness runs the readiness checks now: nil when the command is ready,
// else an error naming every check that failed (and "draining").
func (o *Ops) Readiness() error { return failures(o.checks(true), o.draining.Load()) }

func failures(rs []result, draining bool) error {
	var msgs []string
	if draining {
		msgs = append(msgs, "draining")
	}
	for _, r := range rs {
		if r.err != nil {
			msgs = append(msgs, r.name+": "+r.err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.Newf("not ready: %s", strings.Join(msgs, "; "))
}

func (o *Ops) answer(w http.ResponseWriter, r *http.Request, rs []result, draining bool) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	failed := draining
	for _, x := range rs {
		failed = failed || x.err != nil
	}
	_, verbose := r.URL.Query()["verbose"]
	if failed {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	var b strings.Builder
	if draining {
		b.WriteString("[-]draining\n")
	}
	sorted := append([]result(nil), rs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	for _, x := range sorted {
		switch {
		case x.err != nil:
			fmt.Fprintf(&b, "[-]%s: %v\n", x.name, x.err)
		case verbose:
			fmt.Fprintf(&b, "[+]%s ok\n", x.name)
		}
	}
	if failed {
		b.WriteString("failed\n")
	} else {
		b.WriteString("ok\n")
	}
	_, _ = w.Write([]byte(b.String()))
}

// Close shuts the endpoint down: it stops accepting connections, waits for
// the requests in progress up to ShutdownGrace (then cuts them) and
// returns once the server's goroutine ended. It may be called more than
// once; ctx bounds the wait too.
func (o *Ops) Close(ctx context.Context) error {
	o.closeOnce.Do(func() {
		if o.srv == nil {
			return
		}
		sctx, cancel := context.WithTimeout(ctx, o.cfg.ShutdownGrace)
		defer cancel()
		if o.srv.Shutdown(sctx) != nil {
			o.closeErr = o.srv.Close() // a request outlived the grace: cut it
		}
		<-o.done
	})
	return o.closeErr
}
