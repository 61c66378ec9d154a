package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// maxPoolMiB bounds --max-pool-mib: 1 TiB.
const maxPoolMiB = 1 << 20

// sessionBounds are kvstream decode's bounds on what one prefill session
// may make a server hold (decode.Config.MaxRoomsPerSession and
// MaxChunksPerRoom); 0 is the library's default.
type sessionBounds struct{ rooms, chunks int }

func (b *sessionBounds) add(fl *pflag.FlagSet) {
	fl.IntVar(&b.rooms, "max-rooms-per-session", 0, fmt.Sprintf(
		"the most rooms one prefill session may hold open; a notice that would open one more is refused (0: the default, %d)", decode.DefaultMaxRoomsPerSession))
	fl.IntVar(&b.chunks, "max-chunks-per-room", 0, fmt.Sprintf(
		"the most chunks one room may hold; the notice of one more is refused and fails the room (0: the default, %d)", decode.DefaultMaxChunksPerRoom))
}

// check refuses what decode.New would, naming the flag.
func (b sessionBounds) check() error {
	switch {
	case b.rooms < 0 || b.rooms > decode.MaxRoomsPerSessionLimit:
		return errors.Newf("--max-rooms-per-session %d: want 0 (the default, %d) to %d", b.rooms, decode.DefaultMaxRoomsPerSession, decode.MaxRoomsPerSessionLimit)
	case b.chunks < 0 || b.chunks > decode.MaxChunksPerRoomLimit:
		return errors.Newf("--max-chunks-per-room %d: want 0 (the default, %d) to %d", b.chunks, decode.DefaultMaxChunksPerRoom, decode.MaxChunksPerRoomLimit)
	}
	return nil
}

// apply sets the bounds of every server cfg starts.
func (b sessionBounds) apply(cfg *simsession.DecodeProcessConfig) {
	cfg.MaxRoomsPerSession, cfg.MaxChunksPerRoom = b.rooms, b.chunks
}

// newDecode is `kvstream decode`: its flags over
// simsession.RunDecodeProcess, which s may adjust (a test's hooks).
func newDecode(s seams) *cobra.Command {
	var nf netFlags
	var of opsFlags
	var transport string
	var prefills []string
	var wait time.Duration
	var sessions int
	var maxPool uint64
	var bounds sessionBounds
	var verbose bool
	var record string
	var shard workload.Config // its TP and PP degrees only
	var model, pageOrder string
	cmd := &cobra.Command{
		Use:   "decode",
		Short: "Serve decode pools to prefill processes over a real transport, and verify every page",
		Long: `decode serves prefill processes (kvstream prefill --decode HOST:PORT) on the control plane
(protoactor-go remote, gRPC), one after another and at once (up to 64 sessions), until SIGTERM or
SIGINT. For each prefill it sizes a pool of the prefill's geometry (released once no session holds
it), registers it with the transport (UCX: the prefill writes into it directly), and verifies every
page of every chunk the prefill reports finished against the model's bytes. It prints a line as
each session ends and a summary when it stops. A refused, failed, killed or empty session never
ends it. It is a thin command over package decode (decode.ListenConfig, decode.New,
Server.Accept).

A prefill of a tiny model (kvstream prefill --model tiny-gqa|tiny-mla) names the model and its
prompts in its Hello: as each room's last chunk lands, the decode greedily decodes the room's tokens
from the pool and compares them with the model's own, printing a line per room (tokens_equal,
min_top1_margin, max_logit_diff); a room whose tokens differ fails, and the prefill hears why.

On SIGTERM or SIGINT it drains: it takes no new session, lets the sessions in flight end within
--drain-timeout, prints its summary, and exits 0 when the drain cut nothing (sessions that failed
earlier are in the summary, not in the exit code). With --sessions N it stops by itself once N
prefill sessions that did something ended, and exits 0 only when every one of them completed with
every byte equal (scripts, the tests).

With --prefill-tp, --decode-tp, --prefill-pp or --decode-pp (and --model, --page-order), it serves
a sharded prefill (kvstream prefill with the same flags): one decode pool and server per decode (PP
stage, TP rank), each its own session with the prefill, sized from the decode side's geometry (its
stage's layers, its heads) and checking every page against its share of the model's KV. A prefill
whose sharding differs is refused, naming the flag and both values; the process keeps serving.
--max-pool-mib then bounds each rank's pool.

Off loopback the control plane needs mutual TLS (--tls-dir from kvstream certs, or --tls-ca,
--tls-cert, --tls-key); each session is then bound to its prefill's certificate (--prefill-name
limits which). The UCX data plane uses only the interface of the advertised address (--advertise,
--data-addr). A prefill that answers no heartbeat within --heartbeat is lost. docs/SECURITY.md
says what each plane trusts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			switch {
			case wait < 0:
				return errors.Newf("--wait %v: must not be negative", wait)
			case of.drain <= 0:
				return errors.Newf("--drain-timeout %v: must be positive", of.drain)
			case sessions < 0:
				return errors.Newf("--sessions %d: must not be negative", sessions)
			case maxPool == 0 || maxPool > maxPoolMiB:
				return errors.Newf("--max-pool-mib %d: want 1 to %d", maxPool, maxPoolMiB)
			}
			if err := bounds.check(); err != nil {
				return err
			}
			sharded := shard.PrefillTP != 0 || shard.DecodeTP != 0 || shard.PrefillPP != 0 || shard.DecodePP != 0
			if !sharded && (cmd.Flags().Changed("model") || cmd.Flags().Changed("page-order")) {
				return errors.New("--model and --page-order apply to a sharded decode (--prefill-tp, --decode-tp, --prefill-pp, --decode-pp); unsharded, the pool takes the prefill's geometry")
			}
			order, err := parsePageOrder(pageOrder)
			if err != nil {
				return err
			}
			tlsm, err := nf.check("decode")
			if err != nil {
				return err
			}
			// Its prefills are other processes: refused before serving, not
			// served where none can reach it.
			if err := refuseLoopback("decode", transport); err != nil {
				return err
			}
			if len(prefills) > 0 && tlsm == nil {
				return errors.Newf("--prefill-name %v: names are certificates' (give --tls-dir or --tls-ca/--tls-cert/--tls-key)", prefills)
			}
			log := cliLogger(cmd, verbose)
			defer log.Sync() //nolint:errcheck
			ops, err := of.start(cmd, log)
			if err != nil {
				return err
			}
			defer service.CloseWithin("the operations endpoint", ops.Close, &err)
			pl, err := nf.open(tlsm, log, transport, "decode")
			if err != nil {
				return err
			}
			defer pl.close(&err)
			cfg := simsession.DecodeProcessConfig{Node: pl.node, Transport: pl.tr, TransportName: transport, MaxPoolBytes: maxPool << 20,
				Prefills: prefills, Sessions: sessions, Wait: wait, DrainTimeout: of.drain, TracePath: record, Ops: ops, Out: cmd.OutOrStdout(), Log: log}
			bounds.apply(&cfg)
			if sharded {
				cfg.Shard = &workload.Shard{Model: model, PrefillTP: shard.PrefillTP, DecodeTP: shard.DecodeTP,
					PrefillPP: shard.PrefillPP, DecodePP: shard.DecodePP, Order: order}
			}
			if s.decode != nil {
				s.decode(&cfg)
			}
			return simsession.RunDecodeProcess(cfg)
		},
	}
	fl := cmd.Flags()
	addNetFlags(fl, &nf, "decode", "127.0.0.1:9100")
	fl.StringVar(&transport, "transport", "ucx", "data transport: ucx")
	fl.StringSliceVar(&prefills, "prefill-name", nil, "with TLS: the certificate names of the prefills served (default: any of the CA)")
	fl.IntVar(&sessions, "sessions", 0, "stop after this many prefill sessions that did something (0: serve until SIGTERM or SIGINT)")
	fl.DurationVar(&wait, "wait", 0, "stop serving (and drain) after this long (0: no limit)")
	of.add(fl)
	fl.Uint64Var(&maxPool, "max-pool-mib", 4096, "the most memory the decode pool sized for a prefill may take (sharded: each rank's)")
	bounds.add(fl)
	fl.StringVar(&model, "model", workload.Defaults().Preset.Name, "sharded: the prefill's model preset: "+strings.Join(workload.PresetNames(), ", "))
	addShardFlags(fl, &shard, &pageOrder)
	fl.BoolVar(&verbose, "verbose", false, "log at DEBUG")
	fl.StringVar(&record, "record", "", "write each server's message trace to this file when it stops (sharded: FILE-<server name>; replay it with kvstream replay)")
	groupFlags(cmd, slices.Concat(netGroups, []flagGroup{
		{groupModel, []string{"model", "prefill-tp", "decode-tp", "prefill-pp", "decode-pp", "page-order", "max-pool-mib"}},
		{groupRun, []string{"sessions", "max-rooms-per-session", "max-chunks-per-room", "wait", "verbose", "record"}},
		{groupOps, []string{"metrics-addr", "drain-timeout"}}})...)
	return cmd
}
