package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
)

// closeWithin runs a Close that takes a context, bounded for a command
// that is exiting, and adds its error to *err: a failed Close fails the
// command. A command cut by a second signal (service.Cut) does not wait
// for it: the close goes on in the background until the process exits.
func closeWithin(what string, close func(context.Context) error, err *error) {
	ctx, cancel := context.WithTimeout(service.Cut(), 20*time.Second)
	defer cancel()
	if cerr := close(ctx); cerr != nil {
		if service.Cut().Err() != nil {
			cerr = errors.Newf("abandoned: %v", context.Cause(service.Cut()))
		}
		*err = errors.CombineErrors(*err, errors.Wrapf(cerr, "close %s", what))
	}
}

// closeTransport closes the data plane and adds its error to *err.
func closeTransport(tr interface{ Close() error }, err *error) {
	if cerr := tr.Close(); cerr != nil {
		*err = errors.CombineErrors(*err, errors.Wrap(cerr, "close the transport"))
	}
}

// disconnectAfterEnv is the test hook that makes kvstream decode cut its
// prefill off after that many verified chunks (simsession.Decode's
// DisconnectAfter).
const disconnectAfterEnv = "KVSTREAM_TEST_DISCONNECT_AFTER"

// maxPoolMiB bounds --max-pool-mib: 1 TiB.
const maxPoolMiB = 1 << 20

func newDecode() *cobra.Command {
	var nf netFlags
	var of opsFlags
	var transport string
	var prefills []string
	var wait time.Duration
	var sessions int
	var maxPool uint64
	var verbose bool
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
			if len(prefills) > 0 && tlsm == nil {
				return errors.Newf("--prefill-name %v: names are certificates' (give --tls-dir or --tls-ca/--tls-cert/--tls-key)", prefills)
			}
			log := cliLogger(verbose)
			defer log.Sync() //nolint:errcheck
			ops, err := of.start(cmd, log)
			if err != nil {
				return err
			}
			defer closeWithin("the operations endpoint", ops.Close, &err)
			metrics, err := decode.NewMetrics(ops.Registerer())
			if err != nil {
				return err
			}
			pl, err := nf.open(tlsm, log, transport, "decode")
			if err != nil {
				return err
			}
			defer pl.close(&err)
			node, tr := pl.node, pl.tr
			var d interface {
				Serve(context.Context, simsession.ServeConfig) simsession.DecodeSummary
				Servers() []*decode.Server
				Close(context.Context) error
			}
			ranks := ""
			if sharded {
				sd, err := simsession.StartShardedDecode(node, tr, workload.Shard{Model: model, PrefillTP: shard.PrefillTP, DecodeTP: shard.DecodeTP,
					PrefillPP: shard.PrefillPP, DecodePP: shard.DecodePP, Order: order}, maxPool<<20, prefills, log, simsession.WithObserver(metrics))
				if err != nil {
					return err
				}
				d, ranks = sd, fmt.Sprintf(", %d decode ranks (--decode-tp %d x --decode-pp %d)", sd.Ranks(), max(1, shard.DecodeTP), max(1, shard.DecodePP))
			} else {
				sd, err := simsession.StartDecode(node, tr, maxPool<<20, prefills, log, simsession.WithObserver(metrics))
				if err != nil {
					return err
				}
				// A test hook (docs/RELIABILITY.md): cut the prefill off
				// after N verified chunks while it still writes.
				if v := os.Getenv(disconnectAfterEnv); v != "" {
					if sd.DisconnectAfter, err = strconv.Atoi(v); err != nil || sd.DisconnectAfter < 1 {
						_ = sd.Close(context.Background())
						return errors.Newf("%s=%q: want a positive count of chunks", disconnectAfterEnv, v)
					}
				}
				d = sd
			}
			defer closeWithin("the decode server", func(ctx context.Context) error {
				cerr := d.Close(ctx)
				if errors.Is(cerr, decode.ErrNotQuiesced) {
					// A prefill's access could not be confirmed revoked (UCX
					// over shared memory lets a peer write this memory
					// itself): the pools stay mapped until the process exits,
					// after the transport closed. Nothing is lost.
					log.Debug("decode pools kept mapped until exit", zap.String("error", cerr.Error()))
					return nil
				}
				return cerr
			}, &err)
			// Ready while every rank's server takes sessions.
			ops.Ready("accepting", func(context.Context) error {
				for _, srv := range d.Servers() {
					st, err := srv.State()
					switch {
					case err != nil:
						return err
					case st.Draining || st.Closed:
						return errors.New("not taking sessions: draining")
					}
				}
				return nil
			})
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "decode: listening on %s (transport %s)%s\n", node.Addr(), transport, ranks)
			// The first SIGTERM or SIGINT drains, a second cuts the drain.
			sig := newShutdown()
			defer sig.Stop()
			ctx := sig.Context()
			if wait > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, wait)
				defer cancel()
			}
			s := d.Serve(ctx, simsession.ServeConfig{Runs: sessions, DrainTimeout: of.drain, Hard: sig.Hard(),
				OnSession: func(e simsession.SessionEnd) { fmt.Fprintln(out, e) },
				OnRoom:    func(r simsession.RoomCheck) { fmt.Fprintln(out, r) }})
			ops.SetDraining()
			fmt.Fprintln(out, s)
			switch {
			case sessions > 0 && s.Sessions == s.Outcomes["empty"]:
				return errors.Newf("decode: no prefill session did anything before the process stopped (--sessions %d)", sessions)
			case sessions > 0 && !s.Complete():
				return errors.New("decode: not every session completed with every chunk successful and every byte (tiny models: every token) equal")
			case !s.DrainedClean():
				return errors.Newf("decode: the drain cut %d sessions still in flight after --drain-timeout %v", s.Cut, of.drain)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	addNetFlags(fl, &nf, "decode", "127.0.0.1:9100")
	fl.StringVar(&transport, "transport", "ucx", "data transport: ucx (loopback does not cross processes)")
	fl.StringSliceVar(&prefills, "prefill-name", nil, "with TLS: the certificate names of the prefills served (default: any of the CA)")
	fl.IntVar(&sessions, "sessions", 0, "stop after this many prefill sessions that did something (0: serve until SIGTERM or SIGINT)")
	fl.DurationVar(&wait, "wait", 0, "stop serving (and drain) after this long (0: no limit)")
	of.add(fl)
	fl.Uint64Var(&maxPool, "max-pool-mib", 4096, "the most memory the decode pool sized for a prefill may take (sharded: each rank's)")
	fl.StringVar(&model, "model", workload.Defaults().Preset.Name, "sharded: the prefill's model preset: "+strings.Join(workload.PresetNames(), ", "))
	addShardFlags(fl, &shard, &pageOrder)
	fl.BoolVar(&verbose, "verbose", false, "log at DEBUG")
	groupFlags(cmd, slices.Concat(netGroups, []flagGroup{
		{groupModel, []string{"model", "prefill-tp", "decode-tp", "prefill-pp", "decode-pp", "page-order", "max-pool-mib"}},
		{groupRun, []string{"sessions", "wait", "verbose"}},
		{groupOps, []string{"metrics-addr", "drain-timeout"}}})...)
	return cmd
}

func newPrefill() *cobra.Command {
	f := &simFlags{cfg: workload.Defaults()}
	var nf netFlags
	var decodeAddr, decodeName, transport string
	var connect time.Duration
	var monolithic bool
	var tiny tinyFlags
	var of opsFlags
	cmd := &cobra.Command{
		Use:   "prefill",
		Short: "Run the sim workload with its data over a real transport into a decode process",
		Long: `prefill runs the sim workload (simulated GPU, real engine) with the KV going over a real transport
(UCX) into a decode process (kvstream decode), which verifies every page. The link is real, so
--link-gbps and --time-scale do not apply. It prints one summary line and exits 0 only when every
chunk succeeded and the decode process found every byte equal. If the decode process dies or
hangs, its chunks fail and the run stops. The session with the decode process is
package decode's Client (decode.Dial, Notify per chunk, Bye with the run's outcome).

With --model tiny-gqa or tiny-mla it runs a small transformer's prefill on CPU streams instead (as
kvstream generate does; defaults too), one room per --requests prompt, and the decode process
decodes --new-tokens from each room's KV and compares them with the model's; it exits 0 only when
every room's tokens are equal (tokens_equal: true) and its own first token is the model's.
Unsharded (CP allowed); --plant commits a production bug on purpose.

With --prefill-tp, --decode-tp, --prefill-pp or --decode-pp it runs one engine per prefill (PP stage,
TP rank), as kvstream sim does, and opens one session per decode (stage, rank) with a decode process
started with the same sharding flags; each engine writes into every decode rank what cp/reshard
routes to it (head slices, layer subsets, the MLA latent's copy), over one transport. A chunk is
reported to every decode rank once every prefill rank's Finish returned for it.

Off loopback the control plane needs mutual TLS (--tls-dir from kvstream certs, or --tls-ca,
--tls-cert, --tls-key); the decode's certificate must carry --decode-name. A decode process that
answers no heartbeat within --heartbeat (a hung one keeps its connections open) is lost at once:
its chunks fail without waiting for the finish timeout.

On SIGTERM or SIGINT it drains: no request starts, the requests started are prefilled and sent to
the end, it says goodbye and prints what it did; it exits 0 when every request it started succeeded.
After --drain-timeout, or at a second signal, it launches no forward after the current one (whose
chunks still finish) and exits non-zero. --metrics-addr serves the engine's metrics, /healthz and
/readyz (ready while its session with the decode process is open).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if _, ok := tinylm.Presets[f.model]; ok {
				for _, name := range []string{"metrics-addr", "drain-timeout"} {
					if cmd.Flags().Changed(name) {
						return errors.Newf("--%s: not with the tiny model %q (a short run on CPU, not a service)", name, f.model)
					}
				}
				return runTinyPrefill(cmd, f, &tiny, &nf, decodeAddr, decodeName, transport, connect, monolithic)
			}
			if err := tiny.unused(cmd); err != nil {
				return err
			}
			cfg, err := f.config()
			if err != nil {
				return err
			}
			for _, name := range []string{"link-gbps", "link-latency-us", "time-scale"} {
				if cmd.Flags().Changed(name) {
					return errors.Newf("--%s %s: prefill runs on real time over a real link (the sim's link model does not apply)", name, cmd.Flags().Lookup(name).Value)
				}
			}
			if err := checkHostPort("--decode", decodeAddr, false); err != nil {
				return err
			}
			if decodeName == "" {
				return errors.New("--decode-name is empty: the name the decode's certificate carries")
			}
			if connect < 0 {
				return errors.Newf("--connect-timeout %v: must not be negative", connect)
			}
			tlsm, err := nf.check("prefill")
			if err != nil {
				return err
			}
			log := cliLogger(f.verbose)
			defer log.Sync() //nolint:errcheck
			ops, err := of.start(cmd, log)
			if err != nil {
				return err
			}
			defer closeWithin("the operations endpoint", ops.Close, &err)
			cfg.EngineOptions = append(cfg.EngineOptions, system.WithMetrics(ops.Registerer()))
			pl, err := nf.open(tlsm, log, transport, "prefill")
			if err != nil {
				return err
			}
			defer pl.close(&err)
			node, tr := pl.node, pl.tr
			plane := simsession.NewPrefill(node, decode.DialConfig{Decode: decodeAddr, DecodeName: decodeName, PageSize: cfg.PageSize, ConnectTimeout: connect}, tr, cfg.PromptTokens)
			// The decode process is this transport's only peer: once it is
			// lost (its connection, or its heartbeats: a hung process keeps
			// its connections open and completes nothing), closing the
			// transport fails the chunks in flight to it at once instead of
			// at the finish timeout. The engine hears of the loss too
			// (Engine.PeerLost), and refuses new chunks for it.
			plane.OnPeerLost(func(error) { go func() { _ = tr.Close() }() })
			ops.Ready("decode session", func(context.Context) error { return plane.Ready() })
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			if !f.noProg {
				cfg.Progress = func(done, total int) { fmt.Fprintf(errOut, "prefill: forward %d/%d done\n", done, total) }
			}
			// The first SIGTERM or SIGINT drains: no request starts, those
			// started finish. --drain-timeout later, or at a second
			// signal, no forward follows the current one.
			sig := newShutdown()
			defer sig.Stop()
			cfg.Drain = sig.Draining()
			ctx, cut := context.WithCancelCause(context.Background())
			defer cut(nil)
			ran := make(chan struct{})
			go func() {
				select {
				case <-sig.Draining():
				case <-ran:
					return
				}
				ops.SetDraining()
				fmt.Fprintf(errOut, "prefill: %s: draining: no new request starts, those started finish (--drain-timeout %v; a second signal stops after the current forward)\n", sig.Reason(), of.drain)
				select {
				case <-sig.Hard().Done():
					cut(context.Cause(sig.Hard()))
				case <-time.After(of.drain):
					cut(errors.Newf("--drain-timeout %v passed", of.drain))
				case <-ran:
				}
			}()
			mr, err := workload.RunRemote(ctx, cfg, log, plane, !monolithic)
			close(ran)
			if err != nil {
				if plane.Lost() == nil {
					byeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, _ = plane.End(byeCtx, err)
					cancel()
				}
				if ctx.Err() != nil {
					// Cut before the run began (while connecting): say so.
					return errors.Wrapf(err, "prefill: %v", context.Cause(ctx))
				}
				return err
			}
			// Goodbye, with the run's outcome: a run cut short is never
			// reported complete by the decode side; a drain that finished
			// every request it started is.
			drained := mr.Aborted != "" && ctx.Err() == nil && plane.Lost() == nil && mr.NotStarted > 0 && sig.Reason() != ""
			var aborted error
			if mr.Aborted != "" && !drained {
				aborted = errors.New(mr.Aborted)
			}
			byeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			summary, byeErr := plane.End(byeCtx, aborted)
			cancel()
			mode := "per-layer"
			if monolithic {
				mode = "monolithic"
			}
			if cfg.PrefillTP != 0 || cfg.DecodeTP != 0 || cfg.PrefillPP != 0 || cfg.DecodePP != 0 {
				mode += fmt.Sprintf(" sharded (prefill TP %d x PP %d -> decode TP %d x PP %d, %s pages)",
					max(1, cfg.PrefillTP), max(1, cfg.PrefillPP), max(1, cfg.DecodeTP), max(1, cfg.DecodePP), cfg.PageOrder)
			}
			accepted := max(summary.Chunks, plane.Accepted())
			// Bytes equal: every chunk launched succeeded and the decode
			// process found each it was told of equal (a run cut short
			// expects its Bye to be answered "not complete").
			late := plane.Unanswered()
			equal := mr.Failed == 0 && plane.Verify() == "" && plane.Lost() == nil && (byeErr == nil || aborted != nil) &&
				plane.LateSettled(summary, byeErr, aborted)
			ok := equal && byeErr == nil && (mr.Aborted == "" || drained)
			var line string
			if mr.Aborted == "" {
				line = fmt.Sprintf("prefill: %s over %s, %d requests, %d chunks failed, decode accepted %d chunks, bytes equal: %v, exposed transfer mean %.2f ms, %.1f batches and %.0f writes per forward, %.3f GB crossed the transport at %.2f GB/s",
					mode, transport, mr.RequestsDone, mr.Failed, accepted, equal, mr.ExposedMs,
					mr.SubmitsPerForward, mr.BlocksPerForward, float64(mr.BytesMoved)/1e9, mr.MovedGBytePerS)
			} else {
				// What it did before it stopped: no exposed figures (they
				// compare whole runs with their floor).
				line = fmt.Sprintf("prefill: %s over %s stopped after %d of %d forwards: %d of %d requests done (%d not started), %d chunks done, %d failed, decode accepted %d chunks, bytes equal: %v, %.3f GB crossed the transport; %s",
					mode, transport, mr.ForwardsDone, mr.Forwards, mr.RequestsDone, cfg.Requests, mr.NotStarted, mr.ChunksDone, mr.Failed, accepted, equal,
					float64(mr.BytesMoved)/1e9, mr.Aborted)
			}
			if late > 0 {
				line += fmt.Sprintf("; %d notices not answered within the call timeout (judged by the decode's goodbye)", late)
			}
			if lost := plane.Lost(); lost != nil {
				line += "; decode lost: " + lost.Error()
			}
			if byeErr != nil && plane.Lost() == nil {
				line += "; decode: " + byeErr.Error()
			}
			fmt.Fprintln(out, line)
			if !ok {
				if mr.FirstError != "" {
					fmt.Fprintln(out, "prefill: first failure:", mr.FirstError)
				}
				if equal {
					return errors.Newf("prefill: stopped before every request it started finished (%v)", context.Cause(ctx))
				}
				return errors.New("prefill: not every chunk succeeded with every byte equal")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	addWorkloadFlags(fl, f)
	addShardFlags(fl, &f.cfg, &f.pageOrder)
	fl.StringVar(&decodeAddr, "decode", "127.0.0.1:9100", "the decode process's control-plane address (what it advertises)")
	fl.StringVar(&decodeName, "decode-name", decode.DefaultDecodeName, "with TLS: the name the decode process's certificate must carry")
	fl.DurationVar(&connect, "connect-timeout", 10*time.Second, "keep trying a decode process that is not up yet (or busy) this long, with backoff (0: one attempt)")
	addNetFlags(fl, &nf, "prefill", "127.0.0.1:0")
	fl.StringVar(&transport, "transport", "ucx", "data transport: ucx")
	fl.BoolVar(&monolithic, "monolithic", false, "send monolithically after each forward instead of per layer")
	fl.BoolVar(&f.verbose, "verbose", false, "log the engine at DEBUG")
	fl.BoolVar(&f.noProg, "no-progress", false, "no progress lines")
	of.add(fl)
	tiny.add(fl)
	fl.Lookup("model").Usage = "model preset: " + strings.Join(workload.PresetNames(), ", ") + "; or a tiny model run on CPU: " + strings.Join(tinylm.PresetNames(), ", ")
	// The link is real: the sim's link model does not apply.
	for _, name := range []string{"link-gbps", "link-latency-us", "time-scale"} {
		_ = fl.MarkHidden(name)
	}
	groupFlags(cmd, slices.Concat(netGroups, []flagGroup{
		{groupModel, []string{"model", "layers", "requests", "prompt-tokens", "resident", "chunk-tokens", "page-size", "cp", "cp-rank", "cp-rule",
			"scale", "memory-mib", "layer-us-per-ktok", "seed", "prefill-tp", "decode-tp", "prefill-pp", "decode-pp", "page-order", "new-tokens", "plant"}},
		{groupRun, []string{"decode", "connect-timeout", "monolithic", "group", "submitters", "finish-timeout", "verbose", "no-progress"}},
		{groupOps, []string{"metrics-addr", "drain-timeout"}}})...)
	return cmd
}
