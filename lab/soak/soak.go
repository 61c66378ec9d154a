package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
)

// soak is one run: the decode under test, the side lane's node and
// transport, the report being filled.
type soak struct {
	// ctx ends with Run's, or when the decode crashed: the side lane's
	// calls stop waiting then.
	ctx   context.Context
	cfg   Config
	geom  testbed.Geometry
	pages [][]int // each request's decode pages by position
	dec   *decodeProc
	node  *decode.Node   // the side lane's control plane (nil without one)
	tr    rdma.Transport // the bye-writer's transport (nil without one)
	// gate keeps the side lane out of a pause-decode: its sessions would
	// lose the stopped decode too, and their outcome would say nothing.
	gate sync.RWMutex

	mu        sync.Mutex
	rep       Report
	measuring bool            // the start figures were taken: samples count towards the peak
	runs      []time.Duration // legitimate runs: start to exit
	afterOpen []time.Duration // and their session's opening to the exit
	halt      string          // why the main lane stops early
}

// Bounds of the waits (generous: they bound a hang, not a pace, and the
// soak must hold on a loaded machine).
const (
	sampleEvery = 250 * time.Millisecond
	// openBound: a prefill's session opens (process start, Hello).
	openBound = time.Minute
	// runBound: a prefill runs to its end.
	runBound = 2 * time.Minute
	// lateOpen: how long after a prefill died a Hello it sent may still
	// open a session.
	lateOpen = time.Second
	// finishTimeout is each prefill's --finish-timeout; a resumed prefill
	// must exit within it, its calls' timeouts and a margin (resumeBound).
	finishTimeout = 10 * time.Second
	resumeBound   = finishTimeout + 2*decode.DefaultCallTimeout + 15*time.Second
)

// lostBound is how long the decode may take to declare a silent prefill
// lost, and endBound to end a session whose prefill is gone.
func (s *soak) lostBound() time.Duration { return 2*s.cfg.Heartbeat + 10*time.Second }
func (s *soak) endBound() time.Duration  { return 2*s.cfg.Heartbeat + 20*time.Second }

// Run runs a soak (see the package comment). Its error is a soak that
// could not run (a bad Config, a decode that did not start); what the soak
// found is in the Report, whose OK is the verdict.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Check(); err != nil {
		return Report{}, err
	}
	geom, pages, err := cfg.Workload.Layout(cfg.Seed)
	if err != nil {
		return Report{}, err
	}
	s := &soak{cfg: cfg, geom: geom, pages: pages, rep: Report{Seed: cfg.Seed, Mix: cfg.Mix.String(), UCXTLS: os.Getenv("UCX_TLS"),
		Served: map[Kind]int{}, Injected: map[Kind]int{}, Bounds: cfg.Bounds}}
	began := time.Now()
	if cfg.Mix.total(SideKinds) > 0 {
		if s.node, err = decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0", Heartbeat: decode.HeartbeatWithin(cfg.Heartbeat), Log: cfg.Logger}); err != nil {
			return Report{}, errors.Wrap(err, "soak: the side lane's node")
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = s.node.Close(cctx)
		}()
	}
	if cfg.Mix[ByeWriter] > 0 {
		if s.tr, err = cfg.Open("ucx", "soak-bye-writer"); err != nil {
			return Report{}, errors.Wrap(err, "soak: the bye-writer's transport")
		}
		defer func() { _ = s.tr.Close() }()
	}
	if s.dec, err = startDecode(&s.cfg); err != nil {
		return Report{}, err
	}
	defer s.dec.kill()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.dec.crashed:
			cancel()
		case <-sctx.Done():
		}
	}()
	s.ctx = sctx
	fmt.Fprintf(cfg.Log, "soak: decode pid %d listening on %s, metrics at %s; UCX_TLS=%s\n", s.dec.cmd.Process.Pid, s.dec.addr, s.dec.metrics, s.rep.UCXTLS)

	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go s.sampler(stopSampling, sampled)
	stopSampler := sync.OnceFunc(func() { close(stopSampling); <-sampled })
	defer stopSampler()

	mainRng := rand.New(rand.NewPCG(cfg.Seed, 0x6d61696e))
	// The warm-up: a clean run (the decode's first session allocates a
	// pool and lazy structures), and the side lane's node's first contact
	// (a Hello the decode refuses: the decode keeps a connection to a node
	// that lives, a dozen goroutines and two files, as long as the soak
	// runs), both before the start figures.
	s.mainEpisode(0, Clean, mainRng)
	if s.node != nil {
		s.refused(0)
	}
	if s.figures(&s.rep.RSSMiB.Start, &s.rep.FDs.Start, &s.rep.Goroutines.Start, "start") {
		s.mu.Lock()
		s.measuring, s.rep.StartFigures = true, true
		s.rep.RSSMiB.Peak, s.rep.FDs.Peak, s.rep.Goroutines.Peak = s.rep.RSSMiB.Start, s.rep.FDs.Start, s.rep.Goroutines.Start
		s.mu.Unlock()
	}

	stopSide := make(chan struct{})
	sideDone := make(chan struct{})
	if cfg.Mix.total(SideKinds) > 0 {
		go s.sideLane(stopSide, sideDone, rand.New(rand.NewPCG(cfg.Seed, 0x73696465)))
	} else {
		close(sideDone)
	}
	pick := newPicker(mainRng, MainKinds, cfg.Mix)
	deadline := time.Now().Add(cfg.For)
	for i := 1; (cfg.Episodes == 0 || i <= cfg.Episodes) && time.Now().Before(deadline); i++ {
		if why := s.stopWhy(ctx); why != "" {
			break
		}
		k := pick.next()
		if s.mainEpisode(i, k, mainRng) {
			pick.covered(k)
		}
		s.mu.Lock()
		s.rep.Episodes = i
		s.mu.Unlock()
	}
	close(stopSide)
	<-sideDone

	if s.dec.crashedWhy() == "" {
		s.mu.Lock()
		s.measuring = false
		s.mu.Unlock()
		end := s.figures(&s.rep.RSSMiB.End, &s.rep.FDs.End, &s.rep.Goroutines.End, "end")
		s.mu.Lock()
		s.rep.EndFigures = end
		s.rep.RSSMiB.Peak = max(s.rep.RSSMiB.Peak, s.rep.RSSMiB.End)
		s.rep.FDs.Peak = max(s.rep.FDs.Peak, s.rep.FDs.End)
		s.rep.Goroutines.Peak = max(s.rep.Goroutines.Peak, s.rep.Goroutines.End)
		s.mu.Unlock()
		stopSampler()
		exit := s.dec.stop()
		s.mu.Lock()
		s.rep.DecodeExit = exit
		s.mu.Unlock()
	}
	s.dec.mu.Lock()
	crash, summary := s.dec.crash, s.dec.summary
	s.dec.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.DecodeSummary = summary
	if crash != "" {
		s.rep.DecodeCrashes, s.rep.Crash = 1, crash
		s.rep.note("the decode's lines around its crash:\n%s", s.dec.crashLines())
	}
	if s.rep.Interrupted == "" {
		if why := s.halt; why != "" {
			s.rep.Interrupted = why
		} else if ctx.Err() != nil {
			s.rep.Interrupted = "the soak's context ended: " + context.Cause(ctx).Error()
		}
	}
	s.rep.Seconds = time.Since(began).Seconds()
	s.rep.judge()
	return s.rep, nil
}

// stopWhy says why the main lane stops before its time, or "".
func (s *soak) stopWhy(ctx context.Context) string {
	if why := s.dec.crashedWhy(); why != "" {
		return "the decode crashed"
	}
	if ctx.Err() != nil {
		return "the soak's context ended"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.halt
}

// sampler samples the decode every sampleEvery: the peaks, once the start
// figures were taken.
func (s *soak) sampler(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		f, err := s.dec.sample()
		if err != nil || !f.procFilesWereRead {
			continue
		}
		s.mu.Lock()
		if f.metricsWereRead {
			// The decode's own counts as last seen: all there is of them
			// after a crash.
			s.rep.DecodeSessions, s.rep.QuarantinedPages = f.sessions, f.quarantinedPages
		}
		if s.measuring {
			s.rep.Samples++
			s.rep.RSSMiB.Peak = max(s.rep.RSSMiB.Peak, f.rssMiB)
			s.rep.FDs.Peak = max(s.rep.FDs.Peak, float64(f.fds))
			if f.metricsWereRead {
				s.rep.Goroutines.Peak = max(s.rep.Goroutines.Peak, float64(f.goroutines))
			}
		}
		s.mu.Unlock()
	}
}

// figures waits until the decode ended every session (main and side
// lanes), lets it settle, and samples it into rss, fds and goroutines
// (with its session counts). It reports whether it could.
func (s *soak) figures(rss, fds, goroutines *float64, which string) bool {
	if !s.dec.waitFor(s.endBound(), nil, func() bool { return len(s.dec.openLocked(true)) == 0 }) {
		if s.dec.crashedWhy() != "" {
			return false
		}
		s.misbehaved("before the %s figures: the decode did not end the sessions of %v within %v", which, s.dec.openSessions(true), s.endBound())
	}
	time.Sleep(s.cfg.Settle)
	var f figures
	var err error
	for try := 0; try < 5; try++ {
		if f, err = s.dec.sample(); err == nil && f.metricsWereRead {
			break
		}
		time.Sleep(sampleEvery)
	}
	if err != nil {
		s.mu.Lock()
		s.rep.note("the %s figures: %v", which, err)
		s.mu.Unlock()
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	*rss, *fds, *goroutines = f.rssMiB, float64(f.fds), float64(f.goroutines)
	s.rep.Samples++
	s.rep.DecodeSessions, s.rep.QuarantinedPages = f.sessions, f.quarantinedPages
	fmt.Fprintf(s.cfg.Log, "soak: %s figures: RSS %.1f MiB, %d open files, %d goroutines\n", which, f.rssMiB, f.fds, f.goroutines)
	return true
}

// misbehaved counts a fault not answered as it must be, and notes why.
// Once the decode crashed, or the soak was stopped, nothing is: what fails
// then is the crash's or the stop's doing.
func (s *soak) misbehaved(format string, args ...any) {
	if s.ctx.Err() != nil || s.dec.crashedWhy() != "" {
		fmt.Fprintf(s.cfg.Log, "soak: after the decode's crash or the soak's stop: %s\n", fmt.Sprintf(format, args...))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Misbehaved++
	s.rep.note(format, args...)
	fmt.Fprintf(s.cfg.Log, "soak: MISBEHAVED: %s\n", fmt.Sprintf(format, args...))
}
