package simsession

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/generate"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// byeBound bounds a prefill's goodbye to its decode process.
const byeBound = 10 * time.Second

// PrefillProcessConfig is what RunPrefillProcess runs: `kvstream
// prefill`'s flags, and the planes the command opened.
type PrefillProcessConfig struct {
	// Workload is the sim workload; its page size is the session's.
	Workload workload.Config
	// Dial names the decode process (Decode, DecodeName, ConnectTimeout).
	Dial decode.DialConfig
	// Node and Transport are the control and data planes: the command
	// opens and closes them. TransportName names the transport in the
	// summary.
	Node          *decode.Node
	Transport     rdma.Transport
	TransportName string
	// Monolithic sends after each forward instead of per layer.
	Monolithic bool
	// Progress prints a line on ErrOut as each forward is done.
	Progress bool
	// DrainTimeout bounds the drain that the first SIGTERM or SIGINT
	// starts.
	DrainTimeout time.Duration
	// Ops gets the engine's metrics and the session's readiness; Out the
	// summary, ErrOut the progress and the drain's notice, Log the rest.
	Ops         *service.Ops
	Out, ErrOut io.Writer
	Log         *zap.Logger
}

// RunPrefillProcess is `kvstream prefill` for the sim workload: the
// workload's KV over the transport into the decode process, which checks
// every page; then the goodbye with the run's outcome and one summary
// line. The first SIGTERM or SIGINT drains: no request starts, those
// started finish and are sent to the end; after the drain timeout, or at
// a second signal, no forward follows the current one. The error says why
// the process fails: a chunk that failed or whose bytes differ, or a run
// cut before every request it started finished.
func RunPrefillProcess(cfg PrefillProcessConfig) error {
	wl := cfg.Workload
	wl.EngineOptions = append(wl.EngineOptions, system.WithMetrics(cfg.Ops.Registerer()))
	dial := cfg.Dial
	dial.PageSize = wl.PageSize
	tr := cfg.Transport
	plane := NewPrefill(cfg.Node, dial, tr, wl.PromptTokens)
	// The decode process is this transport's only peer: once it is
	// lost (its connection, or its heartbeats: a hung process keeps
	// its connections open and completes nothing), closing the
	// transport fails the chunks in flight to it at once instead of
	// at the finish timeout. The engine hears of the loss too
	// (Engine.PeerLost), and refuses new chunks for it.
	plane.OnPeerLost(func(error) { go func() { _ = tr.Close() }() })
	cfg.Ops.Ready("decode session", func(context.Context) error { return plane.Ready() })
	out, errOut := cfg.Out, cfg.ErrOut
	if cfg.Progress {
		wl.Progress = func(done, total int) { fmt.Fprintf(errOut, "prefill: forward %d/%d done\n", done, total) }
	}
	// The first SIGTERM or SIGINT drains: no request starts, those
	// started finish. The drain timeout later, or at a second signal, no
	// forward follows the current one.
	sig := service.OnSignals()
	defer sig.Stop()
	// The decode process draining (it is stopping, and said so) drains
	// this run the same way: no request starts, those started finish and
	// are sent to it, then the goodbye.
	decodeDrain := make(chan struct{})
	var drainOnce sync.Once
	plane.OnDrain(func(string) { drainOnce.Do(func() { close(decodeDrain) }) })
	drain := make(chan struct{})
	ctx, cut := context.WithCancelCause(context.Background())
	defer cut(nil)
	ran := make(chan struct{})
	go func() {
		select {
		case <-sig.Draining():
		case <-decodeDrain:
		case <-ran:
			return
		}
		close(drain)
		cfg.Ops.SetDraining()
		why := sig.Reason()
		if why == "" {
			why = "the decode process drains (" + plane.Draining() + ")"
		}
		fmt.Fprintf(errOut, "prefill: %s: draining: no new request starts, those started finish (--drain-timeout %v; a second signal stops after the current forward)\n", why, cfg.DrainTimeout)
		select {
		case <-sig.Hard().Done():
			cut(context.Cause(sig.Hard()))
		case <-time.After(cfg.DrainTimeout):
			cut(errors.Newf("--drain-timeout %v passed", cfg.DrainTimeout))
		case <-ran:
		}
	}()
	wl.Drain = drain
	mr, err := workload.RunRemote(ctx, wl, cfg.Log, plane, !cfg.Monolithic)
	close(ran)
	if err != nil {
		if plane.Lost() == nil {
			byeCtx, cancel := context.WithTimeout(context.Background(), byeBound)
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
	drained := mr.Aborted != "" && ctx.Err() == nil && plane.Lost() == nil && mr.NotStarted > 0 && (sig.Reason() != "" || plane.Draining() != "")
	var aborted error
	if mr.Aborted != "" && !drained {
		aborted = errors.New(mr.Aborted)
	}
	byeCtx, cancel := context.WithTimeout(context.Background(), byeBound)
	summary, byeErr := plane.End(byeCtx, aborted)
	cancel()
	// Bytes equal: every chunk launched succeeded and the decode
	// process found each it was told of equal (a run cut short
	// expects its Bye to be answered "not complete").
	equal := mr.Failed == 0 && plane.Verify() == "" && plane.Refused() == "" && plane.Lost() == nil && (byeErr == nil || aborted != nil) &&
		plane.LateSettled(summary, byeErr, aborted)
	ok := equal && byeErr == nil && (mr.Aborted == "" || drained)
	v := bytesVerdict{equal: equal, differ: plane.Verify()}
	fmt.Fprintln(out, prefillSummary(cfg, mr, plane, max(summary.Chunks, plane.Accepted()), v, byeErr))
	if !ok {
		if mr.FirstError != "" {
			fmt.Fprintln(out, "prefill: first failure:", mr.FirstError)
		}
		// The error says what the summary says.
		switch {
		case equal:
			return errors.Newf("prefill: stopped before every request it started finished (%v)", context.Cause(ctx))
		case v.differ != "":
			return errors.Newf("prefill: the decode process refused or found different a chunk: %s", v.differ)
		case plane.Refused() != "":
			return errors.Newf("prefill: the decode process refused chunk notices without comparing their bytes: %s", plane.Refused())
		case plane.Lost() != nil:
			return errors.Newf("prefill: the decode process was lost after %d of %d forwards; the chunks it was not told of were not compared", mr.ForwardsDone, mr.Forwards)
		case mr.Failed > 0:
			return errors.Newf("prefill: %d chunks failed", mr.Failed)
		}
		return errors.New("prefill: the decode process did not report every chunk complete")
	}
	return nil
}

// bytesVerdict is what a prefill can say of the bytes: equal (every chunk
// succeeded and the decode process found each equal), differ (the decode
// process's first refusal or mismatch of a chunk it was told of), or
// neither: no byte was found different, but not every chunk was compared
// (it failed, the run was cut, the decode process was lost).
type bytesVerdict struct {
	equal  bool
	differ string
}

func (v bytesVerdict) String() string {
	switch {
	case v.equal:
		return "bytes equal: true"
	case v.differ != "":
		return "bytes equal: false"
	}
	return "bytes equal: not compared for every chunk (none compared differed)"
}

// prefillSummary is a prefill process's line: what it sent and what the
// decode process accepted, and, for a run that stopped early, what it did
// before it stopped.
func prefillSummary(cfg PrefillProcessConfig, mr *workload.ModeReport, plane *Prefill, accepted int, bytes bytesVerdict, byeErr error) string {
	wl := cfg.Workload
	mode := "per-layer"
	if cfg.Monolithic {
		mode = "monolithic"
	}
	if wl.PrefillTP != 0 || wl.DecodeTP != 0 || wl.PrefillPP != 0 || wl.DecodePP != 0 {
		mode += fmt.Sprintf(" sharded (prefill TP %d x PP %d -> decode TP %d x PP %d, %s pages)",
			max(1, wl.PrefillTP), max(1, wl.PrefillPP), max(1, wl.DecodeTP), max(1, wl.DecodePP), wl.PageOrder)
	}
	var line string
	if mr.Aborted == "" {
		line = fmt.Sprintf("prefill: %s over %s, %d requests, %d chunks failed, decode accepted %d chunks, %v, exposed transfer mean %.2f ms, %.1f batches and %.0f writes per forward, %.3f GB crossed the transport at %.2f GB/s",
			mode, cfg.TransportName, mr.RequestsDone, mr.Failed, accepted, bytes, mr.ExposedMs,
			mr.SubmitsPerForward, mr.BlocksPerForward, float64(mr.BytesMoved)/1e9, mr.MovedGBytePerS)
	} else {
		// What it did before it stopped: no exposed figures (they
		// compare whole runs with their floor).
		line = fmt.Sprintf("prefill: %s over %s stopped after %d of %d forwards: %d of %d requests done (%d not started), %d chunks done, %d failed, decode accepted %d chunks, %v, %.3f GB crossed the transport; %s",
			mode, cfg.TransportName, mr.ForwardsDone, mr.Forwards, mr.RequestsDone, wl.Requests, mr.NotStarted, mr.ChunksDone, mr.Failed, accepted, bytes,
			float64(mr.BytesMoved)/1e9, mr.Aborted)
	}
	if mr.WorksResent > 0 {
		line += fmt.Sprintf("; %d groups re-sent after a broken connection, %d chunks resumed", mr.WorksResent, mr.ChunksResumed)
	}
	if late := plane.Unanswered(); late > 0 {
		line += fmt.Sprintf("; %d notices not answered within the call timeout (judged by the decode's goodbye)", late)
	}
	if d := plane.Draining(); d != "" {
		line += "; decode drained: " + d
	}
	if lost := plane.Lost(); lost != nil {
		line += "; decode lost: " + lost.Error()
	}
	if r := plane.Refused(); r != "" {
		line += "; decode refused a notice: " + r
	}
	if byeErr != nil && plane.Lost() == nil {
		line += "; decode: " + byeErr.Error()
	}
	return line
}

// TinyPrefillProcessConfig is what RunTinyPrefillProcess runs: `kvstream
// prefill --model tiny-gqa|tiny-mla`'s flags, and the planes the command
// opened.
type TinyPrefillProcessConfig struct {
	// Generate is the tiny model's run, Requests its rooms (one prompt
	// each); its page size is the session's.
	Generate generate.Config
	Requests int
	// Dial names the decode process (Decode, DecodeName, ConnectTimeout).
	Dial decode.DialConfig
	// Node and Transport are the control and data planes: the command
	// opens and closes them. TransportName names the transport in the
	// report.
	Node          *decode.Node
	Transport     rdma.Transport
	TransportName string
	// Monolithic sends after each forward instead of per layer.
	Monolithic bool
	// Out gets the report, Log the rest.
	Out io.Writer
	Log *zap.Logger
}

// RunTinyPrefillProcess is `kvstream prefill` for a tiny model:
// generate.RunRemote over a session whose decode process checks every
// room's tokens, then the goodbye and the report. The first SIGTERM or
// SIGINT cuts the run (a short one, not a service). The error says why the
// process fails: a room whose tokens the decode process did not decode
// equal to the model's.
func RunTinyPrefillProcess(cfg TinyPrefillProcessConfig) error {
	dial := cfg.Dial
	dial.PageSize = cfg.Generate.PageSize
	tr := cfg.Transport
	plane := NewTinyPrefill(cfg.Node, dial, tr, cfg.Log)
	// As for the sim: a lost decode process fails the chunks in flight at
	// once.
	plane.OnPeerLost(func(error) { go func() { _ = tr.Close() }() })
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal cuts the run; from then on the default handling
	// is back, so a second ends the process at once, whatever still
	// waits.
	context.AfterFunc(ctx, stop)
	rep, err := generate.RunRemote(ctx, cfg.Generate, cfg.Requests, plane, !cfg.Monolithic, cfg.Log)
	if err != nil {
		if plane.Lost() == nil {
			byeCtx, cancel := context.WithTimeout(context.Background(), byeBound)
			_, _ = plane.End(byeCtx, err)
			cancel()
		}
		return err
	}
	byeCtx, cancel := context.WithTimeout(context.Background(), byeBound)
	_, byeErr := plane.End(byeCtx, nil)
	cancel()
	out := cfg.Out
	rep.Text(out, cfg.TransportName)
	if lost := plane.Lost(); lost != nil {
		fmt.Fprintln(out, "prefill: decode lost:", lost)
	} else if byeErr != nil {
		fmt.Fprintln(out, "prefill: decode:", byeErr)
	}
	if !rep.TokensEqual || byeErr != nil {
		return errors.New("prefill: not every room's tokens were decoded equal to the model's by the decode process")
	}
	return nil
}
