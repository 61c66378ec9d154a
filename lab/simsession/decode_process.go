package simsession

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/workload"
	"go.uber.org/zap"
)

// DecodeProcessConfig is what RunDecodeProcess serves: `kvstream decode`'s
// flags, and the planes the command opened.
type DecodeProcessConfig struct {
	// Node and Transport are the control and data planes: the command
	// opens and closes them. TransportName names the transport in the
	// first line.
	Node          *decode.Node
	Transport     rdma.Transport
	TransportName string
	// Shard, if set, serves a sharded prefill: one server and pool per
	// decode (PP stage, TP rank) of its degrees (StartShardedDecode).
	Shard *workload.Shard
	// MaxPoolBytes bounds the pool sized for a prefill (each rank's when
	// sharded); Prefills, if set, are the certificate names of the
	// prefills served.
	MaxPoolBytes uint64
	Prefills     []string
	// MaxRoomsPerSession and MaxChunksPerRoom are every server's
	// (decode.Config's fields of the same names; 0: decode's default).
	MaxRoomsPerSession int
	MaxChunksPerRoom   int
	// Sessions, if positive, stops the process once that many prefill
	// sessions that did something ended; Wait, if positive, stops serving
	// after that long. DrainTimeout bounds the drain.
	Sessions     int
	Wait         time.Duration
	DrainTimeout time.Duration
	// TracePath, if set, has every server record its message trace there
	// (decode.Config.TracePath: a sharded decode's servers each to the
	// path and "-" and its name), written when the process stops.
	TracePath string
	// Ops gets the servers' metrics (decode.NewMetrics) and readiness;
	// Out the process's lines: where it listens, each session's end, each
	// tiny model's room check and the summary. Log gets the rest.
	Ops *service.Ops
	Out io.Writer
	Log *zap.Logger
	// DisconnectAfter is a test hook (unsharded only; Decode's field of
	// the same name): cut a prefill off after that many verified chunks,
	// while it still writes. The command never sets it: a test binary that
	// runs itself as the command does.
	DisconnectAfter int
}

// decodeProcess is an unsharded Decode or a ShardedDecode.
type decodeProcess interface {
	Serve(context.Context, ServeConfig) DecodeSummary
	Servers() []*decode.Server
	Close(context.Context) error
}

// serverOptions are what cfg sets in every server's decode.Config.
func (cfg DecodeProcessConfig) serverOptions(obs decode.Observer) []Option {
	opts := []Option{WithObserver(obs), WithSessionBounds(cfg.MaxRoomsPerSession, cfg.MaxChunksPerRoom)}
	if cfg.TracePath != "" {
		opts = append(opts, func(c *decode.Config) { c.TracePath = cfg.TracePath })
	}
	return opts
}

// RunDecodeProcess is `kvstream decode`: it serves prefill processes, one
// after another and at once, until SIGTERM or SIGINT (then it drains:
// no new session, those in flight end within the drain timeout), until
// cfg.Wait passed, or until cfg.Sessions sessions that did something
// ended. It prints a line as each session ends and its summary. The error
// says why the process fails: with cfg.Sessions, a session that was not
// complete with every byte (or token) equal; always, a drain that cut a
// session.
func RunDecodeProcess(cfg DecodeProcessConfig) (err error) {
	metrics, err := decode.NewMetrics(cfg.Ops.Registerer())
	if err != nil {
		return err
	}
	var d decodeProcess
	ranks := ""
	opts := cfg.serverOptions(metrics)
	if s := cfg.Shard; s != nil {
		sd, err := StartShardedDecode(cfg.Node, cfg.Transport, *s, cfg.MaxPoolBytes, cfg.Prefills, cfg.Log, opts...)
		if err != nil {
			return err
		}
		d, ranks = sd, fmt.Sprintf(", %d decode ranks (--decode-tp %d x --decode-pp %d)", sd.Ranks(), max(1, s.DecodeTP), max(1, s.DecodePP))
	} else {
		sd, err := StartDecode(cfg.Node, cfg.Transport, cfg.MaxPoolBytes, cfg.Prefills, cfg.Log, opts...)
		if err != nil {
			return err
		}
		sd.DisconnectAfter = cfg.DisconnectAfter
		d = sd
	}
	defer service.CloseWithin("the decode server", func(ctx context.Context) error {
		cerr := d.Close(ctx)
		if errors.Is(cerr, decode.ErrNotQuiesced) {
			// A prefill's access could not be confirmed revoked (UCX
			// over shared memory lets a peer write this memory
			// itself): the pools stay mapped until the process exits,
			// after the transport closed. Nothing is lost.
			cfg.Log.Debug("decode pools kept mapped until exit", zap.String("error", cerr.Error()))
			return nil
		}
		return cerr
	}, &err)
	// Ready while every rank's server takes sessions.
	cfg.Ops.Ready("accepting", func(context.Context) error {
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
	out := cfg.Out
	fmt.Fprintf(out, "decode: listening on %s (transport %s)%s\n", cfg.Node.Addr(), cfg.TransportName, ranks)
	// The first SIGTERM or SIGINT drains, a second cuts the drain.
	sig := service.OnSignals()
	defer sig.Stop()
	ctx := sig.Context()
	if cfg.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Wait)
		defer cancel()
	}
	s := d.Serve(ctx, ServeConfig{Runs: cfg.Sessions, DrainTimeout: cfg.DrainTimeout, Hard: sig.Hard(),
		OnSession: func(e SessionEnd) { fmt.Fprintln(out, e) },
		OnRoom:    func(r RoomCheck) { fmt.Fprintln(out, r) }})
	cfg.Ops.SetDraining()
	fmt.Fprintln(out, s)
	switch {
	case cfg.Sessions > 0 && s.Sessions == s.Outcomes["empty"]:
		return errors.Newf("decode: no prefill session did anything before the process stopped (--sessions %d)", cfg.Sessions)
	case cfg.Sessions > 0 && !s.Complete():
		return errors.New("decode: not every session completed with every chunk successful and every byte (tiny models: every token) equal")
	case !s.DrainedClean():
		return errors.Newf("decode: the drain cut %d sessions still in flight after --drain-timeout %v", s.Cut, cfg.DrainTimeout)
	}
	return nil
}
