package main

import (
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/spf13/cobra"
)

// newPrefill is `kvstream prefill`: its flags over
// simsession.RunPrefillProcess, or RunTinyPrefillProcess for a tiny model.
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
			// The workload's own bounds (the sharding included) before a
			// node or a transport is opened.
			if err := cfg.Check(); err != nil {
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
			if err := refuseLoopback("prefill", transport); err != nil {
				return err
			}
			log := cliLogger(cmd, f.verbose)
			defer log.Sync() //nolint:errcheck
			ops, err := of.start(cmd, log)
			if err != nil {
				return err
			}
			defer service.CloseWithin("the operations endpoint", ops.Close, &err)
			pl, err := nf.open(tlsm, log, transport, "prefill")
			if err != nil {
				return err
			}
			defer pl.close(&err)
			return simsession.RunPrefillProcess(simsession.PrefillProcessConfig{
				Workload: cfg, Dial: decode.DialConfig{Decode: decodeAddr, DecodeName: decodeName, ConnectTimeout: connect},
				Node: pl.node, Transport: pl.tr, TransportName: transport, Monolithic: monolithic, Progress: !f.noProg,
				DrainTimeout: of.drain, Ops: ops, Out: cmd.OutOrStdout(), ErrOut: cmd.ErrOrStderr(), Log: log,
			})
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
