package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdproc"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/launch"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// clusterFlags are a node's discovery flags: where etcd is, and how to
// reach it as operators run it (client TLS).
type clusterFlags struct {
	etcd, prefix              string
	ttl                       time.Duration
	etcdCA, etcdCert, etcdKey string
	etcdTLSDir                string
}

// Files of --etcd-tls-dir: the CA, the client's certificate and key (and,
// for the etcd kvstream up starts itself, etcd's own). `kvstream certs DIR
// --nodes etcd,etcd-client` writes them.
const (
	etcdClientName = "etcd-client"
	etcdServerName = "etcd"
)

func (f *clusterFlags) add(fl *pflag.FlagSet, launcher bool) {
	etcdHelp := "etcd client `URLs`, comma-separated (https://10.0.0.5:2379)"
	if launcher {
		etcdHelp += "; empty: up starts one (with client TLS when --etcd-tls-dir also holds etcd.pem and etcd.key)"
	}
	fl.StringVar(&f.etcd, "etcd", "", etcdHelp)
	fl.StringVar(&f.etcdTLSDir, "etcd-tls-dir", "", "etcd client TLS from the files in `DIR`: "+netsecCA+", "+etcdClientName+".pem and "+etcdClientName+".key (kvstream certs DIR --nodes etcd,etcd-client writes them)")
	fl.StringVar(&f.etcdCA, "etcd-ca", "", "etcd client TLS: the CA that signed etcd's certificate (PEM `FILE`)")
	fl.StringVar(&f.etcdCert, "etcd-cert", "", "etcd client TLS: this node's client certificate (PEM `FILE`), for etcd's --client-cert-auth")
	fl.StringVar(&f.etcdKey, "etcd-key", "", "etcd client TLS: this node's client key (PEM `FILE`)")
	if !launcher {
		fl.StringVar(&f.prefix, "cluster-prefix", cluster.DefaultPrefix, "root of this cluster's keys in etcd")
		fl.DurationVar(&f.ttl, "member-ttl", 0, "how long a member that stopped keeping alive stays visible (0: cluster.DefaultTTL)")
	}
}

// netsecCA is the CA file name of a TLS directory.
const netsecCA = "ca.pem"

// files are the etcd client TLS files the flags name.
func (f *clusterFlags) files() (cluster.TLSFiles, error) {
	files := cluster.TLSFiles{CA: f.etcdCA, Cert: f.etcdCert, Key: f.etcdKey}
	switch {
	case f.etcdTLSDir != "" && files.Given():
		return files, errors.New("--etcd-tls-dir and --etcd-ca/--etcd-cert/--etcd-key: give one or the other")
	case f.etcdTLSDir != "":
		files = cluster.TLSFiles{CA: filepath.Join(f.etcdTLSDir, netsecCA), Cert: filepath.Join(f.etcdTLSDir, etcdClientName+".pem"),
			Key: filepath.Join(f.etcdTLSDir, etcdClientName+".key")}
	}
	return files, nil
}

// tls is the etcd client TLS (nil without TLS flags) and, for a launcher
// that starts etcd itself (own), etcd's server TLS from --etcd-tls-dir.
func (f *clusterFlags) tls(own bool) (*tls.Config, *etcdproc.TLS, error) {
	files, err := f.files()
	if err != nil || !files.Given() {
		return nil, nil, err
	}
	c, err := files.Config()
	if err != nil {
		return nil, nil, errors.Wrap(err, "--etcd-*")
	}
	if !own {
		return c, nil, nil
	}
	if f.etcdTLSDir == "" {
		return nil, nil, errors.New("the etcd up starts serves TLS from --etcd-tls-dir (etcd.pem, etcd.key besides the client's); --etcd-ca/--etcd-cert/--etcd-key are for an --etcd of yours")
	}
	return c, &etcdproc.TLS{CertFile: filepath.Join(f.etcdTLSDir, etcdServerName+".pem"), KeyFile: filepath.Join(f.etcdTLSDir, etcdServerName+".key"),
		CAFile: files.CA, ClientCertFile: files.Cert, ClientKeyFile: files.Key}, nil
}

// endpoints are --etcd's URLs (nil when empty).
func (f *clusterFlags) endpoints() []string {
	if f.etcd == "" {
		return nil
	}
	return strings.Split(f.etcd, ",")
}

// args are the etcd TLS flags to pass on to the nodes.
func (f *clusterFlags) args() []string {
	var out []string
	for _, a := range [][2]string{{"etcd-tls-dir", f.etcdTLSDir}, {"etcd-ca", f.etcdCA}, {"etcd-cert", f.etcdCert}, {"etcd-key", f.etcdKey}} {
		if a[1] != "" {
			out = append(out, "--"+a[0], a[1])
		}
	}
	return out
}

// open connects to etcd.
func (f *clusterFlags) open(log *zap.Logger) (cluster.Provider, error) {
	if f.etcd == "" {
		return nil, errors.New("--etcd is required: a node finds its peers on etcd (kvstream up starts one)")
	}
	tlsc, _, err := f.tls(false)
	if err != nil {
		return nil, err
	}
	p, err := cluster.Open(cluster.Config{Endpoints: f.endpoints(), Prefix: f.prefix, TTL: f.ttl, TLS: tlsc, Logger: log})
	return p, errors.Wrap(err, "--etcd")
}

// opsFlags are a long-running command's operations flags.
type opsFlags struct {
	addr  string
	drain time.Duration
}

func (o *opsFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&o.addr, "metrics-addr", "", "serve /metrics, /healthz and /readyz at `HOST:PORT` (port 0 picks one; empty: none)")
	fl.DurationVar(&o.drain, "drain-timeout", service.DefaultDrainTimeout, "on SIGTERM, how long the work in flight may take to finish before it is cut (a second signal cuts at once)")
}

// start serves the operations endpoint (nothing without --metrics-addr)
// and says where on stderr.
func (o *opsFlags) start(cmd *cobra.Command, log *zap.Logger) (*service.Ops, error) {
	if o.drain <= 0 {
		return nil, errors.Newf("--drain-timeout %v: must be positive", o.drain)
	}
	ops, err := service.Start(service.Config{Addr: o.addr, Log: log})
	if err != nil {
		return nil, err
	}
	if ops.Addr() != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "kvstream: serving metrics at http://%s/metrics (also /healthz, /readyz)\n", ops.Addr())
	}
	return ops, nil
}

// newShutdown starts the signal handling of a long-running command.
func newShutdown() *service.Shutdown { return service.OnSignals() }

// commandLines reads r's lines until it ends; then the node drains (a
// supervisor that closes a node's stdin ends it). With discard, the lines
// are read and dropped (a node that takes no commands), and the channel
// is nil.
func commandLines(r io.Reader, sd *service.Shutdown, discard bool) <-chan string {
	var lines chan string
	if !discard {
		lines = make(chan string)
	}
	go func() {
		if lines != nil {
			defer close(lines)
		}
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if lines == nil {
				continue
			}
			select {
			case lines <- sc.Text():
			case <-sd.Hard().Done():
				return
			}
		}
		sd.Trigger("stdin closed")
	}()
	return lines
}

func newDecodeInstance() *cobra.Command {
	var cf clusterFlags
	var nf netFlags
	var of opsFlags
	var id, transport, rule string
	var size, pageSize int
	var maxPoolMiB uint64
	var verbose bool
	var roomTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "decode-instance",
		Short: "A decode instance of a cluster: serve a CP group's ranks at once, found by id on etcd",
		Long: `decode-instance serves the prefill ranks of a CP group (--cp ranks, --cp-rule) at once, each over its
own session: a room is complete only when every rank owning pages of each of its chunks reported them
successful and every page holds the model's bytes. It registers {id, decode, address} on etcd once it
serves, and prints JSON lines on stdout: ready, waiting (what it waits for, while it waits), one per
room that ended, drain, and its row when it ends. kvstream up starts it.

SIGTERM, SIGINT or the end of its stdin drains it: it deregisters (no rank or router picks it any
more), waits up to --drain-timeout for its sessions to end (their ranks say goodbye), then closes the
rest, prints its row and exits 0 when no session was cut. --metrics-addr serves /metrics, /healthz
and /readyz (ready: registered on etcd, serving, not draining).

Off loopback the control plane needs mutual TLS (--tls-dir or --tls-ca/--tls-cert/--tls-key); etcd
with client TLS takes --etcd-tls-dir or --etcd-ca/--etcd-cert/--etcd-key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			r, err := cp.ParseRule(rule)
			if err != nil {
				return errors.Wrap(err, "--cp-rule")
			}
			log := cliLogger(verbose)
			defer log.Sync() //nolint:errcheck
			prov, err := cf.open(log)
			if err != nil {
				return err
			}
			defer prov.Close()
			tlsm, err := nf.check("decode")
			if err != nil {
				return err
			}
			ops, err := of.start(cmd, log)
			if err != nil {
				return err
			}
			defer ops.Close(context.Background()) //nolint:errcheck
			pl, err := nf.open(tlsm, log, transport, id)
			if err != nil {
				return err
			}
			defer pl.close(&err)
			sd := newShutdown()
			defer sd.Stop()
			commandLines(cmd.InOrStdin(), sd, true)
			return launch.RunDecodeInstance(sd.Context(), sd.Hard(), launch.DecodeInstanceConfig{
				ID: id, Node: pl.node, Transport: pl.tr, Provider: prov,
				Group: decode.Group{Size: size, Rule: r, PageSize: pageSize}, RoomTimeout: roomTimeout,
				MaxPoolBytes: maxPoolMiB << 20, DrainTimeout: of.drain, Ops: ops, Out: cmd.OutOrStdout(), Log: log,
			})
		},
	}
	fl := cmd.Flags()
	cf.add(fl, false)
	fl.StringVar(&id, "id", "decode-0", "this instance's identity in the cluster")
	addNetFlags(fl, &nf, "decode", "127.0.0.1:0")
	fl.StringVar(&transport, "transport", "ucx", "data transport")
	fl.IntVar(&size, "cp", 1, "ranks of the CP group that writes each room")
	fl.StringVar(&rule, "cp-rule", "shared", "CP page rule: shared or contiguous")
	fl.IntVar(&pageSize, "page-size", workload.Defaults().PageSize, "tokens per page")
	fl.Uint64Var(&maxPoolMiB, "max-pool-mib", 4096, "the most memory the decode pool sized for the prefill may take")
	fl.DurationVar(&roomTimeout, "room-timeout", 2*time.Minute, "fail a room not complete this long after its first notice (0: never)")
	fl.BoolVar(&verbose, "verbose", false, "log at DEBUG")
	of.add(fl)
	groupFlags(cmd, slices.Concat([]flagGroup{{groupCluster, []string{"id", "etcd", "etcd-tls-dir", "etcd-ca", "etcd-cert", "etcd-key", "cluster-prefix", "member-ttl"}}},
		netGroups, []flagGroup{
			{groupModel, []string{"cp", "cp-rule", "page-size", "max-pool-mib"}},
			{groupRun, []string{"room-timeout", "verbose"}},
			{groupOps, []string{"metrics-addr", "drain-timeout"}}})...)
	return cmd
}

func newPrefillRank() *cobra.Command {
	f := &simFlags{cfg: workload.Defaults()}
	var cf clusterFlags
	var nf netFlags
	var of opsFlags
	var group, transport, decodeName string
	cmd := &cobra.Command{
		Use:   "prefill-rank",
		Short: "One CP rank of a cluster's prefill group: run batches of the sim workload into the decode instances it is told",
		Long: `prefill-rank is rank --cp-rank of the CP group --cp-group (--cp ranks): its own engine and transport. It
registers {<cp-group>-r<rank>, prefill, address, group, rank, size} on etcd and follows the decode
instances' membership. Each stdin line "run BATCH DECODE-ID" runs one batch of the sim workload (its
pages of every request) into that instance over the rank's session with it: the session is opened at
the instance's first batch and kept, so a request or a forward never asks etcd. It prints JSON lines
on stdout: ready, waiting, forward, one per batch, drain and its row.

The end of its stdin, SIGTERM or SIGINT drains it: it reads no more commands, deregisters, lets its
batches in flight finish within --drain-timeout (then stops them), says goodbye to every instance,
prints its row and exits 0 when no batch was cut. --metrics-addr serves /metrics (the engine's
kvstream_* metrics too), /healthz and /readyz.

Off loopback the control plane needs mutual TLS (--tls-dir or --tls-ca/--tls-cert/--tls-key, and
--decode-name); etcd with client TLS takes --etcd-tls-dir or --etcd-ca/--etcd-cert/--etcd-key. The
modeled-link flags of kvstream sim (--link-gbps, --link-latency-us, --time-scale) do not apply: the
link is real.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if err := refuseIgnored(cmd); err != nil {
				return err
			}
			cfg, err := f.config()
			if err != nil {
				return err
			}
			log := cliLogger(f.verbose)
			defer log.Sync() //nolint:errcheck
			prov, err := cf.open(log)
			if err != nil {
				return err
			}
			defer prov.Close()
			tlsm, err := nf.check("prefill")
			if err != nil {
				return err
			}
			ops, err := of.start(cmd, log)
			if err != nil {
				return err
			}
			defer ops.Close(context.Background()) //nolint:errcheck
			pl, err := nf.open(tlsm, log, transport, fmt.Sprintf("%s-r%d", group, cfg.CP.Rank))
			if err != nil {
				return err
			}
			defer pl.close(&err)
			sd := newShutdown()
			defer sd.Stop()
			return launch.RunPrefillRank(sd.Context(), sd.Hard(), launch.PrefillRankConfig{
				Workload: cfg, Group: group, DecodeName: decodeName, Node: pl.node, Transport: pl.tr, Provider: prov,
				Commands: commandLines(cmd.InOrStdin(), sd, false), DrainTimeout: of.drain, Ops: ops, Out: cmd.OutOrStdout(), Log: log,
			})
		},
	}
	fl := cmd.Flags()
	addWorkloadFlags(fl, f)
	cf.add(fl, false)
	fl.StringVar(&group, "cp-group", "g0", "the CP group's name")
	addNetFlags(fl, &nf, "prefill", "127.0.0.1:0")
	fl.StringVar(&decodeName, "decode-name", decode.DefaultDecodeName, "with TLS: the name every decode instance's certificate must carry")
	fl.StringVar(&transport, "transport", "ucx", "data transport")
	fl.BoolVar(&f.verbose, "verbose", false, "log at DEBUG")
	of.add(fl)
	hideFlags(cmd, "the link is real", ignoredByNodes...)
	groupFlags(cmd, slices.Concat([]flagGroup{{groupCluster, []string{"cp-group", "etcd", "etcd-tls-dir", "etcd-ca", "etcd-cert", "etcd-key", "cluster-prefix", "member-ttl"}}},
		netGroups, []flagGroup{
			{groupModel, workloadFlagNames()},
			{groupRun, []string{"verbose"}},
			{groupOps, []string{"metrics-addr", "drain-timeout"}}})...)
	return cmd
}
