package launch

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdproc"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Group is the CP group Up launches.
const Group = "g0"

// CutGrace is how long a node cut by Up's second signal (Supervisor.Cut)
// may take to exit before it is killed: a cut node skips its drain and
// ends its sessions, which takes well under a second on a quiet machine.
const CutGrace = 3 * time.Second

// Config is what Up runs.
type Config struct {
	// Exe is the kvstream binary the nodes run (decode-instance,
	// prefill-rank); Env their environment (nil: this process's).
	Exe string
	Env []string
	// Ranks prefill ranks of one CP group, Decodes decode instances,
	// Batches batches of Requests requests each.
	Ranks, Decodes, Batches, Requests int
	// PageSize and CPRule are passed to the decode instances (the ranks get
	// them in WorkloadArgs).
	PageSize int
	CPRule   string
	// FinishTimeout bounds a batch's wait: 2×FinishTimeout + 2 minutes.
	FinishTimeout time.Duration
	// WorkloadArgs are passed to every rank (the workload flags set on up).
	WorkloadArgs []string
	// NodeArgs are passed to every node (heartbeat, TLS, drain, logging).
	NodeArgs []string
	// Transport is the data transport between the processes.
	Transport string

	// Etcd are the etcd client URLs; empty starts one (EtcdServer: with
	// client TLS). EtcdTLS is Up's own client's TLS; EtcdArgs the etcd
	// flags passed to every node (--etcd-tls-dir ...).
	Etcd       []string
	EtcdServer *etcdproc.TLS
	EtcdTLS    *tls.Config
	EtcdArgs   []string
	// Prefix is the cluster's key prefix ("": /kvstream/up-PID).
	Prefix string
	// MemberTTL is the members' lease TTL; RoomTimeout a decode instance's
	// room bound.
	MemberTTL, RoomTimeout time.Duration

	// Fault is injected at the first forward of batch FaultBatch;
	// pause-etcd freezes etcd for FaultFor.
	Fault      Fault
	FaultBatch int
	FaultFor   time.Duration

	// UpTimeout bounds the wait for the cluster to come up (2 minutes
	// when zero); DrainTimeout the wait for the batches in flight once a
	// drain began, and each node's stop (30 s when zero).
	UpTimeout, DrainTimeout time.Duration

	// Ops gets the launcher's metrics and readiness (nil: none).
	Ops *service.Ops
	// Log receives failures; Stderr the nodes' stderr and the launcher's
	// status lines (what it waits for).
	Log    *zap.Logger
	Stderr io.Writer
}

// Check validates the configuration, naming the flag of a bad value, and
// fills the defaults. Up calls it; a command calls it first to refuse bad
// flags before it opens anything.
func (c *Config) Check() error {
	switch {
	case c.Ranks < 1 || c.Ranks > 64:
		return errors.Newf("--prefill-ranks %d: want 1 to 64", c.Ranks)
	case c.Decodes < 1 || c.Decodes > 64:
		return errors.Newf("--decode %d: want 1 to 64", c.Decodes)
	case c.Batches < 0:
		return errors.Newf("--batches %d: want 0 or more", c.Batches)
	case c.Requests < 1:
		return errors.Newf("--requests %d: want 1 or more", c.Requests)
	case c.Fault == PauseEtcd && len(c.Etcd) > 0:
		return errors.New("--fault pause-etcd needs the etcd up starts (no --etcd)")
	case c.FaultFor < 0 || c.FaultFor > MaxFaultFor:
		return errors.Newf("--fault-for %v: want 0 to %v (launch.MaxFaultFor)", c.FaultFor, MaxFaultFor)
	case c.FaultBatch < 0:
		// A negative batch never comes: the fault was never injected.
		return errors.Newf("--fault-batch %d: want a batch of the run, counted from 0", c.FaultBatch)
	case c.RoomTimeout < 0:
		return errors.Newf("--room-timeout %v: want 0 (rooms never time out) or more", c.RoomTimeout)
	}
	if c.Batches == 0 {
		c.Batches = 2 * c.Decodes
	}
	if c.Exe == "" {
		return errors.New("launch: no node binary (Config.Exe)")
	}
	if c.Fault != NoFault && c.FaultBatch >= c.Batches {
		return errors.Newf("--fault-batch %d: the run has %d batches (0 to %d)", c.FaultBatch, c.Batches, c.Batches-1)
	}
	if c.UpTimeout <= 0 {
		c.UpTimeout = 2 * time.Minute
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	return nil
}

// up is one run's state.
type up struct {
	cfg  Config
	sup  *Supervisor
	book *book
	inj  *injector
	m    *upMetrics
	res  *cluster.Resolver

	mu    sync.Mutex
	notes []string
}

func (u *up) note(format string, args ...any) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.notes = append(u.notes, fmt.Sprintf(format, args...))
}

// status prints what the launcher is doing now (stderr).
func (u *up) status(format string, args ...any) {
	fmt.Fprintf(u.cfg.Stderr, "up: "+format+"\n", args...)
}

// Up runs a local cluster: etcd (unless Config.Etcd names one), the decode
// instances and the ranks of one CP group, each its own process, finding
// each other on etcd under a prefix of this run; it waits until every node
// is registered and the group is complete, saying what it waits for, then
// routes the batches (router) and reports.
//
// accept ending is the drain: no batch starts after it, the batches in
// flight may finish within Config.DrainTimeout, then the nodes are
// stopped, ranks first. The report's Drain says what the drain lost. hard
// ending (a second signal) cuts every node at once (Supervisor.Cut) and
// every wait of Up's, an injected pause of etcd's included.
func Up(accept, hard context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	m, err := newUpMetrics(registerer(cfg.Ops))
	if err != nil {
		return nil, err
	}
	u := &up{cfg: cfg, book: newBook(cfg.Ranks, cfg.Requests), m: m}

	endpoints := cfg.Etcd
	var etcd *etcdproc.Proc
	if len(endpoints) == 0 {
		dir, err := os.MkdirTemp("", "kvstream-up-etcd-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if etcd, err = etcdproc.Start(etcdproc.Options{DataDir: dir, HeartbeatMs: 50, ElectionMs: 500, TLS: cfg.EtcdServer}); err != nil {
			return nil, errors.Wrap(err, "start etcd (or name one with --etcd)")
		}
		defer etcd.Stop(5 * time.Second)
		endpoints = []string{etcd.Endpoint()}
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = fmt.Sprintf("/kvstream/up-%d", os.Getpid())
	}
	common := append([]string{"--etcd", strings.Join(endpoints, ","), "--cluster-prefix", prefix, "--transport", cfg.Transport,
		"--member-ttl", cfg.MemberTTL.String()}, cfg.EtcdArgs...)
	common = append(common, cfg.NodeArgs...)
	prov, err := cluster.Open(cluster.Config{Endpoints: endpoints, Prefix: prefix, TTL: cfg.MemberTTL, TLS: cfg.EtcdTLS, Logger: cfg.Log})
	if err != nil {
		return nil, err
	}
	defer prov.Close()
	u.res = cluster.NewResolver(prov)
	defer u.res.Close()
	for _, role := range cluster.Roles {
		if err := u.res.Follow(role); err != nil {
			return nil, err
		}
	}

	u.sup = NewSupervisor(cfg.Exe, cfg.Env, cfg.Stderr)
	// The injected faults end with the run: at the drain too, not only at
	// a second signal, or the drain waited for a rolling restart of every
	// remaining decode instance, far past --drain-timeout.
	faultCtx, endFaults := untilEither(accept, hard)
	defer endFaults()
	u.inj = &injector{fault: cfg.Fault, batch: cfg.FaultBatch, pause: cfg.FaultFor, kill: u.sup.Kill, struck: u.book.faulted,
		lastRank: fmt.Sprintf("%s-r%d", Group, cfg.Ranks-1), say: u.status, term: u.sup.Term, ctx: faultCtx,
		registered: func(id string) bool { live, _ := u.live(); return slices.Contains(live, id) },
		openOn:     u.book.openOn, ranks: cfg.Ranks}
	// hard ending (a second signal) cuts every node at once, whatever Up
	// is waiting for then: the cluster coming up, a batch, a node's drain.
	signalled := hard // the caller's: Up derives a shorter one for the drain below
	stopCut := context.AfterFunc(signalled, func() {
		u.status("%v: cutting every node now", context.Cause(signalled))
		u.sup.Cut(CutGrace)
	})
	defer stopCut()
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		u.dispatch()
	}()
	defer func() {
		u.sup.Stop(cfg.DrainTimeout)
		u.sup.Close()
		<-dispatched
	}()
	var decodes []string
	for i := range cfg.Decodes {
		id := "decode-" + strconv.Itoa(i)
		decodes = append(decodes, id)
		u.inj.decodes = append(u.inj.decodes, id)
		args := append([]string{"decode-instance", "--id", id, "--cp", strconv.Itoa(cfg.Ranks), "--cp-rule", cfg.CPRule,
			"--page-size", strconv.Itoa(cfg.PageSize), "--room-timeout", cfg.RoomTimeout.String()}, common...)
		if err := u.sup.Start(ChildSpec{ID: id, Role: cluster.RoleDecode, Args: args}); err != nil {
			return nil, err
		}
	}
	for r := range cfg.Ranks {
		id := fmt.Sprintf("%s-r%d", Group, r)
		args := append(append([]string{"prefill-rank", "--cp-group", Group, "--cp", strconv.Itoa(cfg.Ranks), "--cp-rank", strconv.Itoa(r)}, common...), cfg.WorkloadArgs...)
		if err := u.sup.Start(ChildSpec{ID: id, Role: cluster.RolePrefill, Rank: r, Args: args}); err != nil {
			return nil, err
		}
	}
	if err := u.waitUp(accept); err != nil {
		return nil, err
	}
	// ended is read by /readyz's handler (another goroutine): atomic.
	var ended atomic.Bool
	if cfg.Ops != nil {
		cfg.Ops.Ready("cluster", func(context.Context) error {
			if id, gone := u.sup.AnyGone(cluster.RolePrefill); gone {
				return errors.Newf("prefill rank %s exited", id)
			}
			if ended.Load() {
				return errors.New("the run ended")
			}
			return nil
		})
	}

	t0 := time.Now()
	// The drain: from accept's end, the batches in flight have
	// DrainTimeout (hard cuts it shorter).
	hard, cancelHard := context.WithCancel(hard)
	defer cancelHard()
	var drainAt time.Time
	var drainMu sync.Mutex
	var drainTimer *time.Timer
	stopDrainWatch := context.AfterFunc(accept, func() {
		// /readyz fails first, as the drain begins, not once the batches
		// in flight ended (up to --drain-timeout later).
		if cfg.Ops != nil {
			cfg.Ops.SetDraining()
		}
		drainMu.Lock()
		defer drainMu.Unlock()
		drainAt = time.Now()
		drainTimer = time.AfterFunc(cfg.DrainTimeout, cancelHard)
		u.status("draining (%v): no batch starts now; the %d in flight have %v", context.Cause(accept), u.book.open(), cfg.DrainTimeout)
	})
	defer func() {
		stopDrainWatch()
		drainMu.Lock()
		if drainTimer != nil {
			drainTimer.Stop()
		}
		drainMu.Unlock()
	}()
	rt := &router{
		decodes: decodes,
		live:    u.live,
		running: func(id string) bool { return !u.sup.State(id).Gone },
		avoid:   u.inj.avoid,
		stop: func() string {
			if id, gone := u.sup.AnyGone(cluster.RolePrefill); gone {
				return "rank " + id + " is gone"
			}
			return ""
		},
		start: func(b int, dec string) *batch {
			var bt *batch
			if !u.inj.Gate(dec, func() { bt = u.startBatch(b, dec) }) {
				return nil
			}
			if cfg.Fault == PauseEtcd && b == cfg.FaultBatch {
				u.inj.goPauseEtcd(hard, etcd, prov, func() int { ms, _ := u.res.Members(cluster.RoleDecode); return len(ms) }, cfg.Decodes, b)
			}
			return bt
		},
		await:    u.await,
		note:     u.note,
		waiting:  func(what string) { u.status("%s", what) },
		pickWait: time.Minute,
		poll:     100 * time.Millisecond,
	}
	started, _ := rt.run(accept, hard, cfg.Batches)
	u.inj.wait()
	ended.Store(true)
	elapsed := time.Since(t0)
	u.sup.Stop(cfg.DrainTimeout)

	rep = &Report{PrefillRanks: cfg.Ranks, DecodeInstances: cfg.Decodes, Transport: cfg.Transport, Etcd: strings.Join(endpoints, ","),
		Seconds: elapsed.Seconds(), Fault: string(cfg.Fault), FaultNotes: u.inj.Notes(), BytesEqual: true}
	rep.Batches, rep.Complete = u.book.rows(cfg.Batches)
	for _, b := range rep.Batches {
		rep.FailedChunks += b.FailedChunks
		rep.Bytes += b.Bytes
	}
	rep.Rows = u.sup.Rows()
	for _, r := range rep.Rows {
		if r.Mismatch != "" {
			rep.BytesEqual = false
		}
	}
	rep.Nodes = len(rep.Rows)
	if elapsed > 0 {
		rep.AggregateGBps = float64(rep.Bytes) / elapsed.Seconds() / 1e9
	}
	drainMu.Lock()
	at := drainAt
	drainMu.Unlock()
	if !at.IsZero() {
		d := u.book.drained(at)
		d.Reason = context.Cause(accept).Error()
		d.NotStarted = cfg.Batches - started
		rep.Drain = &d
	}
	u.mu.Lock()
	rep.Notes = append(rep.Notes, u.notes...)
	u.mu.Unlock()
	return rep, nil
}

// registerer is the Prometheus registerer of an optional Ops.
func registerer(o *service.Ops) prometheus.Registerer {
	if o == nil {
		return nil
	}
	return o.Registerer()
}

// opsAddr is where an optional Ops serves ("" for none).
func opsAddr(o *service.Ops) string {
	if o == nil {
		return ""
	}
	return o.Addr()
}

// live lists the decode instances a batch may go to: registered with the
// address their running process announced, so that a dead process whose
// lease has not run out yet is never picked.
func (u *up) live() ([]string, error) {
	ms, err := u.res.Members(cluster.RoleDecode)
	if err != nil {
		return nil, err
	}
	var live []string
	for _, m := range ms {
		st := u.sup.State(m.ID)
		if st.Running && st.Addr == m.Addr {
			live = append(live, m.ID)
		}
	}
	return live, nil
}

// dispatch routes the nodes' events to the book, the fault injector and
// the status lines, until the supervisor closes.
func (u *up) dispatch() {
	for ev := range u.sup.Events() {
		if ev.Exit {
			u.exited(ev)
			continue
		}
		e := ev.Event
		switch e.Event {
		case EventReady:
			u.countNodes()
		case EventWaiting:
			u.status("%s waits: %s", ev.ID, e.What)
		case EventForward:
			u.inj.forward(e)
		case EventBatch:
			u.book.rankReported(e)
		case EventRoom:
			u.book.roomEnded(ev.ID, e)
		}
	}
}

// exited handles a node process's end.
func (u *up) exited(ev ChildEvent) {
	u.countNodes()
	switch ev.Role {
	case cluster.RoleDecode:
		u.book.decodeExited(ev.ID)
	case cluster.RolePrefill:
		u.book.rankExited(ev.Rank)
	}
	u.inj.exited(ev.ID, ev.ExitErr)
	if u.inj.restart(ev.ID, u.sup.Stopping()) {
		// Counted once it happened: Restart fails when the supervisor
		// began stopping since, or the process could not be started.
		if err := u.sup.Restart(ev.ID); err != nil {
			u.inj.note("restart %s: %v", ev.ID, err)
			return
		}
		u.inj.note("%s restarted after the fault", ev.ID)
		u.m.restarts.Inc()
	}
}

func (u *up) countNodes() {
	for _, role := range cluster.Roles {
		n := 0
		for _, id := range u.sup.IDs(role) {
			if u.sup.State(id).Running {
				n++
			}
		}
		u.m.nodes.WithLabelValues(string(role)).Set(float64(n))
	}
}

// waitUp waits until every decode instance Up started is registered with
// the address its process announced and the CP group is complete with
// Up's ranks, saying every few seconds what it still waits for. Members
// Up did not start (another cluster's, a stale or forged record) neither
// count nor stall it.
func (u *up) waitUp(ctx context.Context) error {
	start := time.Now()
	deadline := start.Add(u.cfg.UpTimeout)
	var said time.Time
	for {
		missing := u.missing()
		if len(missing) == 0 {
			return nil
		}
		if id, gone := u.sup.AnyGone(""); gone {
			return errors.Newf("node %s exited before the cluster was up:\n%s", id, u.sup.Stderrs())
		}
		if time.Now().After(deadline) {
			return errors.Newf("the cluster was not up within %v: still waiting for %s\n%s", u.cfg.UpTimeout, strings.Join(missing, "; "), u.sup.Stderrs())
		}
		if time.Since(start) > time.Second && time.Since(said) >= 5*time.Second {
			said = time.Now()
			u.status("waiting for %s (%.0f s of %v)", strings.Join(missing, "; "), time.Since(start).Seconds(), u.cfg.UpTimeout)
		}
		select {
		case <-ctx.Done():
			return errors.Wrapf(context.Cause(ctx), "while waiting for %s", strings.Join(missing, "; "))
		case <-time.After(100 * time.Millisecond): // a poll of the followed (in-memory) membership while processes start
		}
	}
}

// missing says what the cluster still lacks, node by node.
func (u *up) missing() []string {
	var out []string
	decodes, _ := u.res.Members(cluster.RoleDecode)
	prefills, _ := u.res.Members(cluster.RolePrefill)
	registered := func(ms []cluster.Member, id string) (cluster.Member, bool) {
		i := slices.IndexFunc(ms, func(m cluster.Member) bool { return m.ID == id })
		if i < 0 {
			return cluster.Member{}, false
		}
		return ms[i], true
	}
	for _, role := range []cluster.Role{cluster.RoleDecode, cluster.RolePrefill} {
		ms := decodes
		if role == cluster.RolePrefill {
			ms = prefills
		}
		for _, id := range u.sup.IDs(role) {
			st := u.sup.State(id)
			m, ok := registered(ms, id)
			switch {
			case st.Addr == "":
				out = append(out, fmt.Sprintf("%s %s to start (no ready line yet)", role, id))
			case !ok:
				out = append(out, fmt.Sprintf("%s %s to register on etcd", role, id))
			case m.Addr != st.Addr:
				out = append(out, fmt.Sprintf("%s %s: etcd lists it at %s, its process serves at %s (an old lease not expired yet?)", role, id, m.Addr, st.Addr))
			}
		}
	}
	if len(out) == 0 {
		if _, err := cluster.Group(prefills, Group); err != nil {
			out = append(out, err.Error())
		}
	}
	sort.Strings(out)
	return out
}

// startBatch tells every rank to run batch b into dec.
func (u *up) startBatch(b int, dec string) *batch {
	bt := u.book.start(b, dec)
	u.m.inFlight.Inc()
	for _, id := range u.sup.IDs(cluster.RolePrefill) {
		if err := u.sup.Send(id, Command{Batch: b, Decode: dec}.String()); err != nil {
			u.cfg.Log.Warn("tell a rank", zap.String("rank", id), warnErr(err))
		}
	}
	return bt
}

// await waits for a batch's end, bounded by the finish timeout and a
// margin for the forwards themselves, or by hard (the drain's end).
func (u *up) await(hard context.Context, bt *batch) {
	bound := 2*u.cfg.FinishTimeout + 2*time.Minute
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-bt.done:
	case <-t.C:
		u.book.expire(bt, fmt.Sprintf("not ended within %v", bound))
	case <-hard.Done():
		u.book.expire(bt, "the drain ended before the batch did")
	}
	u.m.inFlight.Dec()
	if _, complete := u.book.outcome(bt); complete {
		u.m.complete.Inc()
	} else {
		u.m.failed.Inc()
	}
}

// untilEither returns a context that ends when a or b does, with its
// cause, and the function that releases it.
func untilEither(a, b context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(b)
	stop := context.AfterFunc(a, func() { cancel(context.Cause(a)) })
	return ctx, func() { stop(); cancel(nil) }
}
