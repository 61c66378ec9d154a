package main

import (
	"context"
	"net"
	"os"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/lab/launch"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

type upFlags struct {
	sim                     *simFlags
	ranks, decodes, batches int
	transport, fault        string
	faultBatch              int
	faultFor, memberTTL     time.Duration
	roomTimeout             time.Duration
	jsonOut                 bool
	cluster                 clusterFlags
	ops                     opsFlags
	hb                      netFlags // --heartbeat, --heartbeat-interval only
}

// ignoredByNodes are the shared workload flags the cluster's ranks ignore:
// their link is real (UCX), so the modeled link and time do not apply.
var ignoredByNodes = []string{"link-gbps", "link-latency-us", "time-scale"}

func newUp() *cobra.Command {
	f := &upFlags{sim: &simFlags{cfg: workload.Defaults()}}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Launch a local cluster (etcd, a CP group of prefill ranks, decode instances) and run the sim workload across it",
		Long: `up starts etcd (unless --etcd names one) on a temporary directory, --decode decode instances
(kvstream decode-instance) and --prefill-ranks prefill ranks of one CP group (kvstream prefill-rank),
each its own process, all finding each other on etcd under a prefix of this run. It waits until every
node it started is registered and the group is complete, saying what it still waits for, then acts
as the router: for each of --batches batches of the sim workload it picks a decode instance from the
followed membership (no etcd call) and tells every rank to stream its pages of the batch's requests
into it. A decode instance runs one batch at a time; batches on different instances run at once. A
room is complete only when every rank owning pages of each chunk reported them and the instance found
every byte equal.

It prints a line per batch, a summary and a row per node (--json: one object with bytes_equal,
failed_chunks, nodes, batches and rows) and exits non-zero unless every batch completed (with
--fault, unless every failure is the fault's and the bytes of every completed room are equal).

SIGTERM or Ctrl-C drains: no batch starts, the batches in flight finish within --drain-timeout, the
ranks say goodbye to the decode instances, which deregister and drain in turn; up prints its report
(with "drained") and exits 0 when no batch in flight was lost. A second signal cuts at once, whatever
up waits for (a batch, a node's drain, a --fault's pause): every node gets its second stop (killed
if it has not exited 3 s later), etcd is resumed if paused, and up prints its report and exits
non-zero, saying it was cut.
With --metrics-addr, up serves /metrics, /healthz and /readyz, and so does every node it starts (on
port 0 of the same host; their addresses are in the report's rows).

--fault injects one failure at the first forward of batch --fault-batch: kill-decode (SIGKILL its
decode instance, then restart it under the same id), kill-prefill (SIGKILL the last rank; no batch
is started after it), pause-etcd (freeze etcd for --fault-for, at most 10m; a lookup during the
pause must fail with etcd unavailable, and one after it succeed), rolling-restart (SIGTERM each decode
instance in turn while batches run: it tells its ranks it drains, gets no new batch, exits 0 once its
ranks finished their batch there and said goodbye, and is restarted; no request may be lost).

The modeled-link flags of kvstream sim (--link-gbps, --link-latency-us, --time-scale) do not apply:
the ranks' link is real.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runUp(cmd, f) },
	}
	fl := cmd.Flags()
	addWorkloadFlags(fl, f.sim)
	fl.IntVar(&f.ranks, "prefill-ranks", 2, "prefill ranks in the CP group (processes)")
	fl.IntVar(&f.decodes, "decode", 1, "decode instances (processes)")
	fl.IntVar(&f.batches, "batches", 0, "batches of --requests requests to run (0: two per decode instance)")
	fl.StringVar(&f.transport, "transport", "ucx", "data transport between the processes")
	fl.StringVar(&f.fault, "fault", "", "inject a failure: kill-decode, kill-prefill, pause-etcd or rolling-restart")
	fl.IntVar(&f.faultBatch, "fault-batch", 1, "the batch whose first forward triggers --fault")
	fl.DurationVar(&f.faultFor, "fault-for", 3*time.Second, "how long pause-etcd freezes etcd (at most 10m)")
	fl.DurationVar(&f.roomTimeout, "room-timeout", 2*time.Minute, "a decode instance fails a room not complete this long after its first notice (0: never)")
	fl.BoolVar(&f.jsonOut, "json", false, "print the report as one JSON object")
	fl.BoolVar(&f.sim.verbose, "verbose", false, "log at DEBUG")
	f.cluster.add(fl, true)
	fl.DurationVar(&f.memberTTL, "member-ttl", cluster.DefaultTTL, "the members' lease TTL: how long a killed node stays listed (and how long a starved one may go without renewing it)")
	f.ops.add(fl)
	fl.DurationVar(&f.hb.heartbeat, "heartbeat", defaultHeartbeat, "every node declares a peer lost when it answered no heartbeat for this long (0: off)")
	fl.DurationVar(&f.hb.hbInterval, "heartbeat-interval", 0, "time between the nodes' heartbeats (0: a seventh of --heartbeat)")
	hideFlags(cmd, "the ranks' link is real", ignoredByNodes...)
	hideFlags(cmd, "the CP size is --prefill-ranks's and each rank's rank its own, not up's", "cp", "cp-rank")
	groupFlags(cmd,
		flagGroup{groupCluster, []string{"prefill-ranks", "decode", "etcd", "etcd-tls-dir", "etcd-ca", "etcd-cert", "etcd-key", "member-ttl", "room-timeout"}},
		flagGroup{groupTransport, []string{"transport", "heartbeat", "heartbeat-interval"}},
		flagGroup{groupModel, workloadFlagNames()},
		flagGroup{groupRun, []string{"batches", "fault", "fault-batch", "fault-for", "json", "verbose"}},
		flagGroup{groupOps, []string{"metrics-addr", "drain-timeout"}},
	)
	return cmd
}

func runUp(cmd *cobra.Command, f *upFlags) error {
	if err := refuseIgnored(cmd); err != nil {
		return err
	}
	cfg, err := f.sim.config()
	if err != nil {
		return err
	}
	fault, err := launch.ParseFault(f.fault)
	if err != nil {
		return err
	}
	if f.sim.cfg.CP.Size != 1 || f.sim.cfg.CP.Rank != 0 {
		return errors.New("--cp and --cp-rank are --prefill-ranks's and each rank's, not up's")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	lc := launch.Config{
		Exe: exe, Ranks: f.ranks, Decodes: f.decodes, Batches: f.batches, Requests: cfg.Requests,
		PageSize: cfg.PageSize, CPRule: f.sim.cpRule, FinishTimeout: cfg.FinishTimeout,
		WorkloadArgs: workloadArgs(cmd.Flags()), Transport: f.transport,
		Etcd: f.cluster.endpoints(), EtcdArgs: f.cluster.args(),
		MemberTTL: f.memberTTL, RoomTimeout: f.roomTimeout,
		Fault: fault, FaultBatch: f.faultBatch, FaultFor: f.faultFor,
		DrainTimeout: f.ops.drain, Stderr: cmd.ErrOrStderr(),
	}
	if err := lc.Check(); err != nil {
		return err
	}
	if err := checkMemberTTL(f.memberTTL, false); err != nil {
		return err
	}
	if _, err := f.hb.heartbeatConfig(); err != nil {
		return err
	}
	if f.ops.drain <= 0 {
		return errors.Newf("--drain-timeout %v: must be positive", f.ops.drain)
	}
	if lc.EtcdTLS, lc.EtcdServer, err = f.cluster.tls(len(lc.Etcd) == 0); err != nil {
		return err
	}
	if err := crossProcessTransport("up", f.transport); err != nil {
		return err
	}
	log := cliLogger(cmd, f.sim.verbose)
	defer log.Sync() //nolint:errcheck
	nodeArgs := []string{"--heartbeat", f.hb.heartbeat.String(), "--heartbeat-interval", f.hb.hbInterval.String(),
		"--drain-timeout", f.ops.drain.String()}
	if f.sim.verbose {
		nodeArgs = append(nodeArgs, "--verbose")
	}
	nodeArgs = append(nodeArgs, logArgs(cmd)...)
	if f.ops.addr != "" {
		host, _, err := net.SplitHostPort(f.ops.addr)
		if err != nil {
			return errors.Wrapf(err, "--metrics-addr %q", f.ops.addr)
		}
		nodeArgs = append(nodeArgs, "--metrics-addr", net.JoinHostPort(host, "0"))
	}
	lc.NodeArgs, lc.Log = nodeArgs, log
	ops, err := f.ops.start(cmd, log)
	if err != nil {
		return err
	}
	defer ops.Close(context.Background()) //nolint:errcheck
	lc.Ops = ops
	sd := newShutdown()
	defer sd.Stop()
	rep, err := launch.Up(sd.Context(), sd.Hard(), lc)
	// A run cut by a second signal fails, saying so, whatever it lost.
	cut := sd.Hard().Err() != nil
	if err != nil {
		if cut {
			return errors.Wrapf(err, "up: %v", context.Cause(sd.Hard()))
		}
		return err
	}
	if err := printReport(cmd.OutOrStdout(), f.jsonOut, rep); err != nil {
		return err
	}
	switch {
	case !rep.BytesEqual:
		return errors.New("up: bytes differ on a decode instance")
	case cut:
		return errors.Newf("up: %v: every node was cut, the report says what was lost", context.Cause(sd.Hard()))
	case rep.Drain != nil && rep.Drain.Lost > 0:
		return errors.Newf("up: the drain lost %d of the %d batches in flight", rep.Drain.Lost, rep.Drain.InFlight)
	case rep.Drain != nil && rep.FailedBatches() > 0 && fault == launch.NoFault:
		// The summary says so too: the exit status and it agree.
		return errors.Newf("up: %d batches failed before the drain", rep.FailedBatches())
	case rep.Drain != nil:
		return nil // asked to stop, and lost nothing in flight
	case !rep.Complete && fault == launch.NoFault:
		return errors.New("up: not every batch completed")
	}
	return nil
}

// crossProcessTransport says before anything starts whether this binary
// has a transport that crosses processes by that name (cmd: the command
// that needs one).
func crossProcessTransport(cmd, kind string) error {
	if err := refuseLoopback(cmd, kind); err != nil {
		return err
	}
	if _, ok := transports[kind]; !ok {
		_, err := openTransport(kind, "check", transportOpts{dataHost: "127.0.0.1"}) // says which kinds this binary has
		return err
	}
	return nil
}

// refuseLoopback refuses the loopback transport to a command whose peers
// are other processes, which it cannot reach.
func refuseLoopback(cmd, kind string) error {
	if kind == "loopback" {
		return errors.Newf("--transport loopback does not cross processes: %s needs ucx (go build -tags ucx ./cmd/kvstream)", cmd)
	}
	return nil
}

// workloadArgs passes the workload flags set on up to every rank.
func workloadArgs(fl *pflag.FlagSet) []string {
	names := pflag.NewFlagSet("workload", pflag.ContinueOnError)
	addWorkloadFlags(names, &simFlags{})
	var out []string
	fl.Visit(func(f *pflag.Flag) {
		if names.Lookup(f.Name) != nil && !strings.HasPrefix(f.Name, "cp") {
			out = append(out, "--"+f.Name+"="+f.Value.String())
		}
	})
	// --cp-rule is every rank's (and the decode instances', via up).
	if f := fl.Lookup("cp-rule"); f != nil && f.Changed {
		out = append(out, "--cp-rule="+f.Value.String())
	}
	return out
}
