package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdproc"
	"github.com/kvstream/kvstream/internal/workload"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// upGroup is the CP group `kvstream up` launches.
const upGroup = "g0"

type upFlags struct {
	sim                     *simFlags
	ranks, decodes, batches int
	etcd, transport, fault  string
	faultBatch              int
	faultFor, memberTTL     time.Duration
	roomTimeout             time.Duration
	jsonOut                 bool
}

func newUp() *cobra.Command {
	f := &upFlags{sim: &simFlags{cfg: workload.Defaults()}}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Launch a local cluster (etcd, a CP group of prefill ranks, decode instances) and run the sim workload across it",
		Long: `up starts etcd (unless --etcd names one) on a temporary directory, --decode decode instances
(kvstream decode-instance) and --prefill-ranks prefill ranks of one CP group (kvstream prefill-rank),
each its own process, all finding each other on etcd under a prefix of this run. It waits until every
instance is registered and the group is complete, then acts as the router: for each of --batches
batches of the sim workload it picks a decode instance from the followed membership (no etcd call)
and tells every rank to stream its pages of the batch's requests into it. A decode instance runs one
batch at a time; batches on different instances run at once. A room is complete only when every rank
owning pages of each chunk reported them and the instance found every byte equal.

It prints a line per batch, a summary and a row per node (--json: one object with bytes_equal,
failed_chunks, nodes, batches and rows) and exits non-zero unless every batch completed (with
--fault, unless every failure is the fault's and the bytes of every completed room are equal).

--fault injects one failure at the first forward of batch --fault-batch: kill-decode (SIGKILL its
decode instance, then restart it under the same id), kill-prefill (SIGKILL the last rank; no batch
is started after it), pause-etcd (freeze etcd for --fault-for; a lookup during the pause must fail
with etcd unavailable, and one after it succeed).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runUp(cmd, f) },
	}
	fl := cmd.Flags()
	addWorkloadFlags(fl, f.sim)
	fl.IntVar(&f.ranks, "prefill-ranks", 2, "prefill ranks in the CP group (processes)")
	fl.IntVar(&f.decodes, "decode", 1, "decode instances (processes)")
	fl.IntVar(&f.batches, "batches", 0, "batches of --requests requests to run (0: two per decode instance)")
	fl.StringVar(&f.etcd, "etcd", "", "etcd client URLs to use instead of starting one (http://10.0.0.5:2379)")
	fl.StringVar(&f.transport, "transport", "ucx", "data transport between the processes")
	fl.StringVar(&f.fault, "fault", "", "inject a failure: kill-decode, kill-prefill or pause-etcd")
	fl.IntVar(&f.faultBatch, "fault-batch", 1, "the batch whose first forward triggers --fault")
	fl.DurationVar(&f.faultFor, "fault-for", 3*time.Second, "how long pause-etcd freezes etcd")
	fl.DurationVar(&f.memberTTL, "member-ttl", 2*time.Second, "the members' lease TTL: how long a killed node stays listed")
	fl.DurationVar(&f.roomTimeout, "room-timeout", 2*time.Minute, "a decode instance fails a room not complete this long after its first notice")
	fl.BoolVar(&f.jsonOut, "json", false, "print the report as one JSON object")
	fl.BoolVar(&f.sim.verbose, "verbose", false, "log at DEBUG")
	return cmd
}

// batchRow is one batch's outcome in the report.
type batchRow struct {
	Batch         int     `json:"batch"`
	Decode        string  `json:"decode"`
	Complete      bool    `json:"complete"`
	RoomsComplete int     `json:"rooms_complete"`
	RoomsFailed   int     `json:"rooms_failed"`
	RanksOK       int     `json:"ranks_ok"`
	RanksReported int     `json:"ranks_reported"`
	FailedChunks  int     `json:"failed_chunks"`
	Bytes         uint64  `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	// EndedAfterFaultMs: for a batch in flight when the fault struck, how
	// long after it the last rank and room reported.
	EndedAfterFaultMs float64 `json:"ended_after_fault_ms,omitempty"`
	// RanksFailedAfterFaultMs: the slowest rank's first failed chunk after
	// the fault; RoomsEndedAfterFaultMs: the decode instance's last room
	// end after it.
	RanksFailedAfterFaultMs float64 `json:"ranks_failed_after_fault_ms,omitempty"`
	RoomsEndedAfterFaultMs  float64 `json:"rooms_ended_after_fault_ms,omitempty"`
	Error                   string  `json:"error,omitempty"`
}

// upReport is `kvstream up --json`.
type upReport struct {
	BytesEqual      bool       `json:"bytes_equal"`
	Complete        bool       `json:"complete"`
	FailedChunks    int        `json:"failed_chunks"`
	Nodes           int        `json:"nodes"`
	PrefillRanks    int        `json:"prefill_ranks"`
	DecodeInstances int        `json:"decode_instances"`
	Transport       string     `json:"transport"`
	Etcd            string     `json:"etcd"`
	Seconds         float64    `json:"seconds"`
	Bytes           uint64     `json:"bytes"`
	AggregateGBps   float64    `json:"aggregate_gbps"`
	Fault           string     `json:"fault,omitempty"`
	FaultNotes      []string   `json:"fault_notes,omitempty"`
	Batches         []batchRow `json:"batches"`
	Rows            []nodeRow  `json:"rows"`
}

// child is one node process.
type child struct {
	id, role string
	rank     int
	args     []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	pid    int
	addr   string
	row    *nodeRow
	stderr bytes.Buffer
	exited chan struct{}
	gone   bool // exited, and not restarted yet
}

// upRun is the launcher's state.
type upRun struct {
	f      *upFlags
	cfg    workload.Config
	exe    string
	env    []string
	log    *zap.Logger
	events chan childEvent

	mu       sync.Mutex
	children map[string]*child
	batches  map[int]*upBatch
	faultAt  time.Time
	notes    []string
	faulted  bool
	stopped  atomic.Bool
}

type childEvent struct {
	c    *child
	e    nodeEvent
	exit bool
}

type upBatch struct {
	row      batchRow
	start    time.Time
	ranks    map[int]bool
	rooms    int
	lastSeen time.Time
	done     chan struct{}
	closed   bool
}

func runUp(cmd *cobra.Command, f *upFlags) (err error) {
	cfg, err := f.sim.config()
	if err != nil {
		return err
	}
	switch {
	case f.ranks < 1 || f.ranks > 64:
		return errors.Newf("--prefill-ranks %d: want 1 to 64", f.ranks)
	case f.decodes < 1 || f.decodes > 64:
		return errors.Newf("--decode %d: want 1 to 64", f.decodes)
	case f.fault != "" && f.fault != "kill-decode" && f.fault != "kill-prefill" && f.fault != "pause-etcd":
		return errors.Newf("--fault %q: want kill-decode, kill-prefill or pause-etcd", f.fault)
	case f.fault == "pause-etcd" && f.etcd != "":
		return errors.New("--fault pause-etcd needs the etcd up starts (no --etcd)")
	case f.sim.cfg.CP.Size != 1 || f.sim.cfg.CP.Rank != 0:
		return errors.New("--cp and --cp-rank are --prefill-ranks's and each rank's, not up's")
	}
	if f.batches == 0 {
		f.batches = 2 * f.decodes
	}
	if f.fault != "" && f.faultBatch >= f.batches {
		return errors.Newf("--fault-batch %d: the run has %d batches", f.faultBatch, f.batches)
	}
	if err := crossProcessTransport(f.transport); err != nil {
		return err
	}
	cfg.CP.Size = f.ranks
	log := cliLogger(f.sim.verbose)
	defer log.Sync() //nolint:errcheck
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	u := &upRun{f: f, cfg: cfg, exe: exe, log: log, events: make(chan childEvent, 1024),
		children: map[string]*child{}, batches: map[int]*upBatch{}}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var etcd *etcdproc.Proc
	endpoint := f.etcd
	if endpoint == "" {
		dir, err := os.MkdirTemp("", "kvstream-up-etcd-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if etcd, err = etcdproc.Start(etcdproc.Options{DataDir: dir, HeartbeatMs: 50, ElectionMs: 500}); err != nil {
			return errors.Wrap(err, "start etcd (or name one with --etcd)")
		}
		defer etcd.Stop(5 * time.Second)
		endpoint = etcd.Endpoint()
	}
	prefix := fmt.Sprintf("/kvstream/up-%d", os.Getpid())
	common := []string{"--etcd", endpoint, "--cluster-prefix", prefix, "--transport", f.transport, "--member-ttl", f.memberTTL.String()}
	prov, err := cluster.Open(cluster.Config{Endpoints: []string{endpoint}, Prefix: prefix, TTL: f.memberTTL, Logger: log})
	if err != nil {
		return err
	}
	defer prov.Close()
	res := cluster.NewResolver(prov)
	defer res.Close()
	if err := res.Follow(cluster.RoleDecode); err != nil {
		return err
	}
	_, prefills, err := prov.Watch(ctx, cluster.RolePrefill)
	if err != nil {
		return err
	}
	go func() {
		for range prefills { // drained: Group below lists the ranks itself
		}
	}()

	// Children: decode instances, then the ranks.
	defer u.stopAll()
	for i := range f.decodes {
		id := "decode-" + strconv.Itoa(i)
		args := append([]string{"decode-instance", "--id", id, "--cp", strconv.Itoa(f.ranks), "--cp-rule", f.sim.cpRule,
			"--page-size", strconv.Itoa(cfg.PageSize), "--room-timeout", f.roomTimeout.String()}, common...)
		if err := u.spawn(id, string(cluster.RoleDecode), 0, args); err != nil {
			return err
		}
	}
	wl := workloadArgs(cmd.Flags())
	for r := range f.ranks {
		id := fmt.Sprintf("%s-r%d", upGroup, r)
		args := append(append([]string{"prefill-rank", "--cp-group", upGroup, "--cp", strconv.Itoa(f.ranks), "--cp-rank", strconv.Itoa(r)}, common...), wl...)
		if err := u.spawn(id, string(cluster.RolePrefill), r, args); err != nil {
			return err
		}
	}
	go u.dispatch()
	if err := u.waitUp(ctx, prov, res); err != nil {
		return err
	}

	// The router.
	t0 := time.Now()
	var wg sync.WaitGroup
	busy := map[string]chan struct{}{}
	var etcdNotes sync.WaitGroup
schedule:
	for b := range f.batches {
		if u.rankGone() {
			u.note("batch %d and later not started: a rank is gone", b)
			break
		}
		dec, err := u.pick(ctx, res, b)
		if err != nil {
			u.note("batch %d not started: %v", b, err)
			break
		}
		if busy[dec] == nil {
			busy[dec] = make(chan struct{}, 1)
		}
		select {
		case busy[dec] <- struct{}{}:
		case <-ctx.Done():
			break schedule
		}
		if u.rankGone() {
			u.note("batch %d and later not started: a rank is gone", b)
			<-busy[dec]
			break
		}
		bt := u.startBatch(b, dec)
		if f.fault == "pause-etcd" && b == f.faultBatch {
			etcdNotes.Go(func() { u.pauseEtcd(etcd, prov, res, bt) })
		}
		wg.Go(func() {
			u.awaitBatch(ctx, bt)
			<-busy[dec]
		})
	}
	wg.Wait()
	etcdNotes.Wait()
	elapsed := time.Since(t0)
	u.stopAll()
	rep := u.report(elapsed, endpoint)
	out := cmd.OutOrStdout()
	if f.jsonOut {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.text(out)
	}
	switch {
	case !rep.BytesEqual:
		return errors.New("up: bytes differ on a decode instance")
	case !rep.Complete && f.fault == "":
		return errors.New("up: not every batch completed")
	}
	return nil
}

// crossProcessTransport says before anything starts whether this binary
// has a transport that crosses processes by that name.
func crossProcessTransport(kind string) error {
	if kind == "loopback" {
		return errors.New("--transport loopback does not cross processes: up needs ucx (go build -tags ucx ./cmd/kvstream)")
	}
	if _, ok := transports[kind]; !ok {
		_, err := openTransport(kind, "check", "127.0.0.1") // says which kinds this binary has
		return err
	}
	return nil
}

// workloadArgs passes the workload flags set on up to every rank.
func workloadArgs(fl *pflag.FlagSet) []string {
	names := pflag.NewFlagSet("workload", pflag.ContinueOnError)
	addWorkloadFlags(names, &simFlags{})
	var out []string
	fl.Visit(func(f *pflag.Flag) {
		if names.Lookup(f.Name) != nil {
			out = append(out, "--"+f.Name+"="+f.Value.String())
		}
	})
	return out
}

func (u *upRun) note(format string, args ...any) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.notes = append(u.notes, fmt.Sprintf(format, args...))
}

// spawn starts (or restarts) a node process.
func (u *upRun) spawn(id, role string, rank int, args []string) error {
	u.mu.Lock()
	c := u.children[id]
	if c == nil {
		c = &child{id: id, role: role, rank: rank, args: args}
		u.children[id] = c
	}
	u.mu.Unlock()
	cmd := exec.Command(u.exe, c.args...)
	cmd.Env = os.Environ()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.stderr.Reset()
	// The nodes log failures only (WARN): the launcher's stderr shows them.
	cmd.Stderr = io.MultiWriter(&lockedWriter{mu: &c.mu, w: &c.stderr}, &prefixWriter{prefix: id + ": ", w: os.Stderr})
	c.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return errors.Wrapf(err, "start %s", id)
	}
	exited := make(chan struct{})
	c.mu.Lock()
	// No address until the new process announces it: the old one's
	// registration may still be listed.
	c.cmd, c.stdin, c.pid, c.exited, c.gone, c.row, c.addr = cmd, stdin, cmd.Process.Pid, exited, false, nil, ""
	c.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e nodeEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				continue
			}
			u.events <- childEvent{c: c, e: e}
		}
		_ = cmd.Wait()
		close(exited)
		u.events <- childEvent{c: c, exit: true}
	}()
	return nil
}

// prefixWriter names the node on each chunk of its stderr.
type prefixWriter struct {
	prefix string
	w      io.Writer
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	_, _ = p.w.Write(append([]byte(p.prefix), b...))
	return len(b), nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 256<<10 {
		return len(p), nil
	}
	return l.w.Write(p)
}

// dispatch routes the children's events to the batches.
func (u *upRun) dispatch() {
	for ev := range u.events {
		c, e := ev.c, ev.e
		if ev.exit {
			u.exited(c)
			continue
		}
		switch e.Event {
		case "ready":
			c.mu.Lock()
			c.addr = e.Addr
			c.mu.Unlock()
		case "node":
			c.mu.Lock()
			c.row = e.Row
			c.mu.Unlock()
		case "forward":
			u.forward(c, e)
		case "batch":
			u.mu.Lock()
			if bt := u.batches[e.Batch]; bt != nil && !bt.ranks[e.Rank] {
				bt.ranks[e.Rank] = true
				bt.row.RanksReported++
				bt.row.FailedChunks += e.Failed
				bt.row.Bytes += e.Bytes
				if e.FirstFailureUnixMs != 0 && !u.faultAt.IsZero() {
					bt.row.RanksFailedAfterFaultMs = max(bt.row.RanksFailedAfterFaultMs, float64(e.FirstFailureUnixMs-u.faultAt.UnixMilli()))
				}
				if e.OK {
					bt.row.RanksOK++
				} else if bt.row.Error == "" {
					bt.row.Error = fmt.Sprintf("rank %d: %s", e.Rank, e.Error)
				}
				u.settleLocked(bt)
			}
			u.mu.Unlock()
		case "room":
			u.mu.Lock()
			if bt := u.batches[e.Batch]; bt != nil && bt.row.Decode == c.id {
				if !u.faultAt.IsZero() && bt.start.Before(u.faultAt) {
					bt.row.RoomsEndedAfterFaultMs = float64(time.Since(u.faultAt).Microseconds()) / 1000
				}
				if e.Complete {
					bt.row.RoomsComplete++
				} else {
					bt.row.RoomsFailed++
					if bt.row.Error == "" {
						bt.row.Error = fmt.Sprintf("%s room %d: %s", c.id, e.Room, e.Error)
					}
				}
				u.settleLocked(bt)
			}
			u.mu.Unlock()
		}
	}
}

// settleLocked ends a batch once every rank and every room reported.
func (u *upRun) settleLocked(bt *upBatch) {
	bt.lastSeen = time.Now()
	if bt.closed || bt.row.RanksReported < u.f.ranks || bt.row.RoomsComplete+bt.row.RoomsFailed < u.cfg.Requests {
		return
	}
	u.closeLocked(bt)
}

func (u *upRun) closeLocked(bt *upBatch) {
	if bt.closed {
		return
	}
	bt.closed = true
	bt.row.Seconds = time.Since(bt.start).Seconds()
	if !u.faultAt.IsZero() && bt.start.Before(u.faultAt) {
		bt.row.EndedAfterFaultMs = float64(bt.lastSeen.Sub(u.faultAt).Microseconds()) / 1000
	}
	bt.row.Complete = bt.row.RanksOK == u.f.ranks && bt.row.RoomsComplete == u.cfg.Requests
	close(bt.done)
}

// exited handles a node process's end: a decode instance's rooms in flight
// will never report (their batches end when the ranks do); with the
// kill-decode fault, the instance is restarted under its id.
func (u *upRun) exited(c *child) {
	c.mu.Lock()
	c.gone = true
	role, id := c.role, c.id
	c.mu.Unlock()
	u.mu.Lock()
	restart := u.faulted && u.f.fault == "kill-decode" && role == string(cluster.RoleDecode) && !u.stopping()
	for _, bt := range u.batches {
		if role == string(cluster.RoleDecode) && bt.row.Decode == id && !bt.closed {
			bt.row.RoomsFailed = u.cfg.Requests - bt.row.RoomsComplete
			if bt.row.Error == "" {
				bt.row.Error = "decode instance " + id + " exited"
			}
			bt.lastSeen = time.Now()
			if bt.row.RanksReported == u.f.ranks {
				u.closeLocked(bt)
			}
		}
		if role == string(cluster.RolePrefill) && !bt.ranks[c.rank] && !bt.closed {
			bt.ranks[c.rank] = true
			bt.row.RanksReported++
			if bt.row.Error == "" {
				bt.row.Error = fmt.Sprintf("rank %d exited", c.rank)
			}
			u.settleLocked(bt)
		}
	}
	u.mu.Unlock()
	if restart {
		u.note("%s restarted after the fault", id)
		if err := u.spawn(id, role, 0, c.args); err != nil {
			u.note("restart %s: %v", id, err)
		}
	}
}

// stopping reports whether the launcher is ending its nodes: a node that
// exits then is not restarted.
func (u *upRun) stopping() bool { return u.stopped.Load() }

// forward triggers the fault at the first forward of its batch.
func (u *upRun) forward(c *child, e nodeEvent) {
	u.mu.Lock()
	if u.faulted || u.f.fault == "" || e.Batch != u.f.faultBatch || u.f.fault == "pause-etcd" {
		u.mu.Unlock()
		return
	}
	u.faulted = true
	u.faultAt = time.Now()
	var victim *child
	switch u.f.fault {
	case "kill-decode":
		victim = u.children[e.Decode]
	case "kill-prefill":
		victim = u.children[fmt.Sprintf("%s-r%d", upGroup, u.f.ranks-1)]
	}
	u.mu.Unlock()
	if victim == nil {
		u.note("%s: no node to kill for batch %d", u.f.fault, e.Batch)
		return
	}
	victim.mu.Lock()
	p := victim.cmd.Process
	victim.mu.Unlock()
	_ = p.Kill()
	u.note("%s: SIGKILL %s (pid %d) at the first forward of batch %d", u.f.fault, victim.id, p.Pid, e.Batch)
}

// pauseEtcd freezes etcd once the batch's first rank reported progress...
// or at once: the batch is in flight either way.
func (u *upRun) pauseEtcd(etcd *etcdproc.Proc, prov cluster.Provider, res *cluster.Resolver, bt *upBatch) {
	u.mu.Lock()
	u.faulted, u.faultAt = true, time.Now()
	u.mu.Unlock()
	if err := etcd.Pause(); err != nil {
		u.note("pause-etcd: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := prov.List(ctx, cluster.RoleDecode)
	cancel()
	u.note("pause-etcd: etcd frozen for %v during batch %d; a lookup during the pause: %v (unavailable: %v)",
		u.f.faultFor, bt.row.Batch, err, errors.Is(err, cluster.ErrUnavailable))
	time.Sleep(u.f.faultFor) // the fault's duration, not a synchronisation
	if err := etcd.Resume(); err != nil {
		u.note("pause-etcd: resume: %v", err)
		return
	}
	resumed := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	_, err = prov.List(ctx, cluster.RoleDecode)
	cancel()
	u.note("pause-etcd: resumed; a lookup after it: error %v", err)
	// Leases shorter than the pause ran out: the members register again,
	// and the followed membership sees them back.
	for time.Since(resumed) < 30*time.Second {
		if ms, _ := res.Members(cluster.RoleDecode); len(ms) == u.f.decodes {
			u.note("pause-etcd: all %d decode instances listed again %d ms after the resume", len(ms), time.Since(resumed).Milliseconds())
			return
		}
		time.Sleep(20 * time.Millisecond) // a poll of the followed (in-memory) membership
	}
	u.note("pause-etcd: the decode instances were not all listed again 30 s after the resume")
}

// waitUp waits until every decode instance is registered and the CP group
// is complete.
func (u *upRun) waitUp(ctx context.Context, prov cluster.Provider, res *cluster.Resolver) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ms, _ := res.Members(cluster.RoleDecode)
		ranks, err := prov.List(ctx, cluster.RolePrefill)
		if err == nil {
			_, err = cluster.Group(ranks, upGroup)
		}
		if err == nil && len(ms) == u.f.decodes {
			return nil
		}
		if u.anyGone() {
			return errors.Newf("a node exited before the cluster was up:\n%s", u.stderrs())
		}
		if time.Now().After(deadline) {
			return errors.Newf("the cluster was not up within 2 minutes: %d of %d decode instances; group: %v\n%s", len(ms), u.f.decodes, err, u.stderrs())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // a poll of etcd while processes start
		}
	}
}

func (u *upRun) anyGone() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.children {
		c.mu.Lock()
		gone := c.gone
		c.mu.Unlock()
		if gone {
			return true
		}
	}
	return false
}

func (u *upRun) rankGone() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.children {
		c.mu.Lock()
		gone := c.gone && c.role == string(cluster.RolePrefill)
		c.mu.Unlock()
		if gone {
			return true
		}
	}
	return false
}

func (u *upRun) stderrs() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var b bytes.Buffer
	for id, c := range u.children {
		c.mu.Lock()
		if c.stderr.Len() > 0 {
			fmt.Fprintf(&b, "--- %s:\n%s", id, c.stderr.String())
		}
		c.mu.Unlock()
	}
	return b.String()
}

// pick chooses the batch's decode instance from the followed membership
// (memory, no etcd call): the instances in id order, b modulo their
// number. A live instance is one registered with the address its running
// process announced, so a dead process whose lease has not run out yet is
// never picked. While the intended instance's process runs but is not
// registered yet (a restart waiting for its old lease), the batch waits
// for it, up to a minute; if its process is gone for good, the batch goes
// to another live instance.
func (u *upRun) pick(ctx context.Context, res *cluster.Resolver, b int) (string, error) {
	u.mu.Lock()
	var ids []string
	for id, c := range u.children {
		if c.role == string(cluster.RoleDecode) {
			ids = append(ids, id)
		}
	}
	u.mu.Unlock()
	sort.Strings(ids)
	want := ids[b%len(ids)]
	deadline := time.Now().Add(time.Minute)
	for {
		ms, err := res.Members(cluster.RoleDecode)
		if err != nil {
			return "", err
		}
		var live []string
		for _, m := range ms {
			u.mu.Lock()
			c := u.children[m.ID]
			u.mu.Unlock()
			if c == nil {
				continue
			}
			c.mu.Lock()
			ok := !c.gone && c.addr == m.Addr
			c.mu.Unlock()
			if ok {
				live = append(live, m.ID)
			}
		}
		u.mu.Lock()
		c := u.children[want]
		u.mu.Unlock()
		c.mu.Lock()
		coming := !c.gone
		c.mu.Unlock()
		switch {
		case slices.Contains(live, want):
			return want, nil
		case len(live) > 0 && (!coming || time.Now().After(deadline)):
			return live[b%len(live)], nil
		case time.Now().After(deadline):
			return "", errors.Mark(errors.New("no live decode instance for a minute"), cluster.ErrNotFound)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond): // membership changes are rare; this waits out a restart
		}
	}
}

// startBatch tells every rank to run batch b into dec.
func (u *upRun) startBatch(b int, dec string) *upBatch {
	bt := &upBatch{row: batchRow{Batch: b, Decode: dec}, start: time.Now(), ranks: map[int]bool{}, done: make(chan struct{})}
	u.mu.Lock()
	u.batches[b] = bt
	var ranks []*child
	for _, c := range u.children {
		if c.role == string(cluster.RolePrefill) {
			ranks = append(ranks, c)
		}
	}
	u.mu.Unlock()
	for _, c := range ranks {
		c.mu.Lock()
		_, err := fmt.Fprintf(c.stdin, "run %d %s\n", b, dec)
		c.mu.Unlock()
		if err != nil {
			u.log.Warn("tell a rank", zap.String("rank", c.id), zap.Error(err))
		}
	}
	return bt
}

// awaitBatch waits for a batch's end, bounded by the finish timeout and a
// margin for the forwards themselves.
func (u *upRun) awaitBatch(ctx context.Context, bt *upBatch) {
	bound := 2*u.cfg.FinishTimeout + 2*time.Minute
	select {
	case <-bt.done:
	case <-time.After(bound):
		u.mu.Lock()
		if bt.row.Error == "" {
			bt.row.Error = fmt.Sprintf("not ended within %v", bound)
		}
		u.closeLocked(bt)
		u.mu.Unlock()
	case <-ctx.Done():
	}
}

// stopAll ends the ranks (stdin closed: they say goodbye), then the decode
// instances (SIGTERM: they revoke their registration first), and waits
// for their rows.
func (u *upRun) stopAll() {
	if u.stopped.Swap(true) {
		return
	}
	u.mu.Lock()
	var ranks, decodes []*child
	for _, c := range u.children {
		c.mu.Lock()
		started := c.cmd != nil
		c.mu.Unlock()
		switch {
		case !started:
		case c.role == string(cluster.RolePrefill):
			ranks = append(ranks, c)
		default:
			decodes = append(decodes, c)
		}
	}
	u.mu.Unlock()
	end := func(cs []*child, stop func(*child)) {
		for _, c := range cs {
			stop(c)
		}
		for _, c := range cs {
			c.mu.Lock()
			exited, p := c.exited, c.cmd.Process
			c.mu.Unlock()
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				_ = p.Kill()
				<-exited
			}
		}
	}
	end(ranks, func(c *child) { c.mu.Lock(); _ = c.stdin.Close(); c.mu.Unlock() })
	end(decodes, func(c *child) { c.mu.Lock(); _ = c.cmd.Process.Signal(syscall.SIGTERM); c.mu.Unlock() })
}

func (u *upRun) report(elapsed time.Duration, etcd string) *upReport {
	u.mu.Lock()
	defer u.mu.Unlock()
	rep := &upReport{PrefillRanks: u.f.ranks, DecodeInstances: u.f.decodes, Transport: u.f.transport, Etcd: etcd,
		Seconds: elapsed.Seconds(), Fault: u.f.fault, FaultNotes: u.notes, BytesEqual: true, Complete: true}
	for b := range u.f.batches {
		bt := u.batches[b]
		if bt == nil {
			rep.Complete = false
			continue
		}
		rep.Batches = append(rep.Batches, bt.row)
		rep.FailedChunks += bt.row.FailedChunks
		rep.Bytes += bt.row.Bytes
		rep.Complete = rep.Complete && bt.row.Complete
	}
	for _, c := range u.children {
		c.mu.Lock()
		row := c.row
		c.mu.Unlock()
		if row == nil {
			row = &nodeRow{ID: c.id, Role: c.role, Rank: c.rank, Mismatch: ""}
		}
		if row.Mismatch != "" {
			rep.BytesEqual = false
		}
		rep.Rows = append(rep.Rows, *row)
	}
	sort.Slice(rep.Rows, func(i, j int) bool {
		if rep.Rows[i].Role != rep.Rows[j].Role {
			return rep.Rows[i].Role < rep.Rows[j].Role
		}
		return rep.Rows[i].ID < rep.Rows[j].ID
	})
	rep.Nodes = len(rep.Rows)
	if elapsed > 0 {
		rep.AggregateGBps = float64(rep.Bytes) / elapsed.Seconds() / 1e9
	}
	return rep
}

func (r *upReport) text(w io.Writer) {
	for _, b := range r.Batches {
		line := fmt.Sprintf("up: batch %d on %s: complete %v, rooms %d complete %d failed, ranks ok %d/%d, %.2f s",
			b.Batch, b.Decode, b.Complete, b.RoomsComplete, b.RoomsFailed, b.RanksOK, r.PrefillRanks, b.Seconds)
		if b.RanksFailedAfterFaultMs > 0 {
			line += fmt.Sprintf("; the slowest rank's first failure %.0f ms after the fault", b.RanksFailedAfterFaultMs)
		}
		if b.RoomsEndedAfterFaultMs > 0 && !b.Complete {
			line += fmt.Sprintf("; rooms ended %.0f ms after the fault", b.RoomsEndedAfterFaultMs)
		}
		if b.Error != "" {
			line += "; " + b.Error
		}
		fmt.Fprintln(w, line)
	}
	for _, n := range r.FaultNotes {
		fmt.Fprintln(w, "up:", n)
	}
	fmt.Fprintf(w, "up: %d prefill ranks x %d decode instances over %s (etcd %s): %d batches, complete: %v, bytes equal: %v, %d chunks failed, %.1f MB in %.2f s, aggregate %.3f GB/s\n",
		r.PrefillRanks, r.DecodeInstances, r.Transport, r.Etcd, len(r.Batches), r.Complete, r.BytesEqual, r.FailedChunks,
		float64(r.Bytes)/1e6, r.Seconds, r.AggregateGBps)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "node\trole\taddress\trooms ok\trooms failed\tpages verified\tbatches\tfailed chunks\tsessions\tetcd calls\t")
	for _, n := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", n.ID, n.Role, n.Addr, n.RoomsComplete, n.RoomsFailed, n.PagesVerified,
			n.Batches, n.FailedChunks, n.Sessions, n.Lookups)
	}
	_ = tw.Flush()
}
