package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/launch"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/spf13/cobra"
)

// The cluster's nodes, which kvstream up starts: their flags over the
// node programs of lab/launch.

// newDecodeInstance is `kvstream decode-instance`: its flags over
// launch.RunDecodeInstance.
func newDecodeInstance() *cobra.Command {
	var cf clusterFlags
	var nf netFlags
	var of opsFlags
	var id, transport, rule string
	var size, pageSize int
	var maxPoolMiB uint64
	var verbose bool
	var roomTimeout time.Duration
	var bounds sessionBounds
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
			if err := bounds.check(); err != nil {
				return err
			}
			if roomTimeout < 0 {
				return errors.Newf("--room-timeout %v: want 0 (rooms never time out) or more", roomTimeout)
			}
			r, err := cp.ParseRule(rule)
			if err != nil {
				return errors.Wrap(err, "--cp-rule")
			}
			log := cliLogger(cmd, verbose)
			defer log.Sync() //nolint:errcheck
			etcdTLS, err := cf.check()
			if err != nil {
				return err
			}
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
			// The etcd client after the node: the node's start sets gRPC's
			// global logger, which the etcd client's goroutines read.
			prov, err := cf.open(log, etcdTLS)
			if err != nil {
				return err
			}
			defer prov.Close()
			sd := newShutdown()
			defer sd.Stop()
			launch.DrainAtEOF(cmd.InOrStdin(), sd)
			return launch.RunDecodeInstance(sd.Context(), sd.Hard(), launch.DecodeInstanceConfig{
				ID: id, Node: pl.node, Transport: pl.tr, Provider: prov,
				Group: decode.Group{Size: size, Rule: r, PageSize: pageSize}, RoomTimeout: roomTimeout,
				MaxPoolBytes: maxPoolMiB << 20, MaxRoomsPerSession: bounds.rooms, MaxChunksPerRoom: bounds.chunks,
				DrainTimeout: of.drain, Ops: ops, Out: cmd.OutOrStdout(), Log: log,
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
	bounds.add(fl)
	of.add(fl)
	groupFlags(cmd, slices.Concat([]flagGroup{{groupCluster, []string{"id", "etcd", "etcd-tls-dir", "etcd-ca", "etcd-cert", "etcd-key", "cluster-prefix", "member-ttl"}}},
		netGroups, []flagGroup{
			{groupModel, []string{"cp", "cp-rule", "page-size", "max-pool-mib"}},
			{groupRun, []string{"room-timeout", "max-rooms-per-session", "max-chunks-per-room", "verbose"}},
			{groupOps, []string{"metrics-addr", "drain-timeout"}}})...)
	return cmd
}

// newPrefillRank is `kvstream prefill-rank`: its flags over
// launch.RunPrefillRank.
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
			log := cliLogger(cmd, f.verbose)
			defer log.Sync() //nolint:errcheck
			etcdTLS, err := cf.check()
			if err != nil {
				return err
			}
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
			// The etcd client after the node: the node's start sets gRPC's
			// global logger, which the etcd client's goroutines read.
			prov, err := cf.open(log, etcdTLS)
			if err != nil {
				return err
			}
			defer prov.Close()
			sd := newShutdown()
			defer sd.Stop()
			return launch.RunPrefillRank(sd.Context(), sd.Hard(), launch.PrefillRankConfig{
				Workload: cfg, Group: group, DecodeName: decodeName, Node: pl.node, Transport: pl.tr, Provider: prov,
				Commands: launch.ReadCommands(cmd.InOrStdin(), sd), DrainTimeout: of.drain, Ops: ops, Out: cmd.OutOrStdout(), Log: log,
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
