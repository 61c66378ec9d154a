package launch

import (
	"context"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/simsession"
	"go.uber.org/zap"
)

// DecodeInstanceConfig is what RunDecodeInstance serves.
type DecodeInstanceConfig struct {
	// ID is the instance's identity in the cluster.
	ID string
	// Node and Transport are its control and data planes, Provider its
	// membership (etcd): the command opens them; RunDecodeInstance does
	// not close them.
	Node      *decode.Node
	Transport rdma.Transport
	Provider  cluster.Provider
	// Group is the CP group whose ranks write each room; a room not
	// complete within RoomTimeout (if positive) fails; MaxPoolBytes bounds
	// the pool a rank's Hello sizes.
	Group        decode.Group
	RoomTimeout  time.Duration
	MaxPoolBytes uint64
	// MaxRoomsPerSession and MaxChunksPerRoom bound what one rank's
	// session may make the server hold (decode.Config's fields of the
	// same names; 0: decode's default).
	MaxRoomsPerSession int
	MaxChunksPerRoom   int
	// DrainTimeout bounds the drain (service.DefaultDrainTimeout when
	// zero).
	DrainTimeout time.Duration
	// Ops gets the instance's metrics and readiness (nil: none); Out the
	// node's events (JSON lines); Log its failures.
	Ops *service.Ops
	Out io.Writer
	Log *zap.Logger
}

// serverOptions are what cfg sets in the server's decode.Config beyond
// the group's own.
func (cfg DecodeInstanceConfig) serverOptions() []simsession.Option {
	return []simsession.Option{simsession.WithSessionBounds(cfg.MaxRoomsPerSession, cfg.MaxChunksPerRoom)}
}

// RunDecodeInstance serves the ranks of a CP group at once, each over its
// own session: a room is complete only when every rank owning pages of
// each of its chunks reported them successful and every page holds the
// model's bytes. It registers {id, decode, address} on etcd once it
// serves, emits "ready", one "room" event per room that ended, and, once
// accept ended (SIGTERM, its stdin closed), drains: deregisters (no rank
// or router picks it any more), waits for its sessions to end (their
// ranks say goodbye) within the drain timeout, closes the server (ending
// any session left), emits "drain" and its row. The error says what the
// drain lost, if anything; hard cuts the drain short.
func RunDecodeInstance(accept, hard context.Context, cfg DecodeInstanceConfig) (err error) {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	log := cfg.Log
	prov := &countingProvider{Provider: cfg.Provider}
	out := NewEmitter(cfg.Out)
	addr := cfg.Node.Addr()
	var rowMu sync.Mutex
	row := Row{ID: cfg.ID, Role: string(cluster.RoleDecode), Addr: addr, Metrics: opsAddr(cfg.Ops)}
	var started atomic.Pointer[simsession.Decode] // for the scrape, which may come first
	m, err := newDecodeMetrics(registerer(cfg.Ops), func() float64 {
		d := started.Load()
		if d == nil {
			return 0
		}
		n, _ := d.Verified()
		return float64(n)
	})
	if err != nil {
		return err
	}
	d, err := simsession.StartGroupDecode(cfg.Node, cfg.Transport, cfg.MaxPoolBytes, cfg.Group, cfg.RoomTimeout, cfg.ID,
		func(room decode.Room, err error) {
			batch, rm := simsession.SplitRoom(room.ID)
			e := Event{Event: EventRoom, ID: cfg.ID, Batch: batch, Room: rm, Complete: err == nil && room.Complete}
			rowMu.Lock()
			if e.Complete {
				row.RoomsComplete++
				m.roomsComplete.Inc()
			} else {
				row.RoomsFailed++
				m.roomsFail.Inc()
				if err != nil {
					e.Error = err.Error()
				}
			}
			rowMu.Unlock()
			out.Emit(e)
		}, log, cfg.serverOptions()...)
	if err != nil {
		return err
	}
	started.Store(d)
	closed := false
	closeServer := func(ctx context.Context) error {
		if closed {
			return nil
		}
		closed = true
		return d.Close(ctx)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if cerr := closeServer(ctx); cerr != nil {
			err = errors.CombineErrors(err, errors.Wrap(cerr, "close the decode server"))
		}
	}()

	// Sessions: counted while open, for the drain.
	var sessions service.InFlight
	var waiters sync.WaitGroup
	acceptCtx, stopAccepting := context.WithCancel(context.Background())
	waiters.Go(func() {
		for {
			ss, err := d.Server.Accept(acceptCtx)
			if err != nil {
				return
			}
			sessions.Add()
			m.sessions.Inc()
			waiters.Go(func() {
				defer sessions.Done()
				defer m.sessions.Dec()
				// Ends when the rank said goodbye and left, or was
				// lost, or at the server's Close at the latest; or at
				// a cut, which does not wait for that Close.
				_, _ = ss.Wait(hard)
			})
		}
	})
	defer func() {
		stopAccepting()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = closeServer(ctx)
		waiters.Wait()
	}()

	// Registered last, once it serves: a member found is a member that
	// answers.
	reg, err := saying(out, cfg.ID, "registration on etcd (an earlier process's lease may still hold the identity)",
		func() (cluster.Registration, error) {
			return prov.Register(accept, cluster.Member{ID: cfg.ID, Role: cluster.RoleDecode, Addr: addr})
		})
	if err != nil {
		return errors.Wrapf(err, "register decode instance %s", cfg.ID)
	}
	deregistered := false
	deregister := func() error {
		if deregistered {
			return nil
		}
		deregistered = true
		m.registered.Set(0)
		return reg.Close()
	}
	defer func() { _ = deregister() }()
	m.registered.Set(1)
	if cfg.Ops != nil {
		cfg.Ops.Ready("registered", func(context.Context) error { return regState(reg) })
		cfg.Ops.Ready("serving", func(context.Context) error {
			if _, mismatch := d.Verified(); mismatch != "" {
				return errors.Newf("a page differed: %s", mismatch)
			}
			return nil
		})
	}
	out.Emit(Event{Event: EventReady, ID: cfg.ID, Addr: addr, Pid: os.Getpid(), Metrics: opsAddr(cfg.Ops)})

	var regErr error
	select {
	case <-accept.Done():
	case <-reg.Done():
		regErr = errors.Wrapf(reg.Err(), "decode instance %s: registration ended", cfg.ID)
		log.Warn("registration ended", zap.String("id", cfg.ID), warnErr(reg.Err()))
	}
	reason := "registration ended"
	if accept.Err() != nil {
		reason = context.Cause(accept).Error()
	}
	// Ends the server's Drain when this returns (its Close ended the
	// sessions).
	drainCtx, stopDrain := context.WithCancel(hard)
	defer stopDrain()
	rep := service.Drain{
		Timeout: cfg.DrainTimeout, Ops: cfg.Ops, Reason: reason, Log: log,
		// Revoked first: no rank or router picks an instance that is
		// going. Then every open session is told (wire.Drain): its rank
		// finishes its batch here and says goodbye, so the drain ends
		// when they are done.
		Stop: func(context.Context) error {
			err := deregister()
			go func() { _ = d.Server.Drain(drainCtx) }()
			return err
		},
		InFlight: sessions.Count,
		Wait:     sessions.Wait,
		Goodbye:  closeServer,
	}.Run(hard)
	rowMu.Lock()
	row.PagesVerified, row.Mismatch = d.Verified()
	row.Lookups = prov.calls.Load()
	row.Drained = !rep.Lost()
	final := row
	rowMu.Unlock()
	out.Emit(Event{Event: EventDrain, ID: cfg.ID, Drain: rep.String()})
	out.Emit(Event{Event: EventNode, ID: cfg.ID, Row: &final})
	if regErr != nil {
		return regErr
	}
	return rep.Err()
}

// regState is a registration's readiness: nil while it holds.
func regState(reg cluster.Registration) error {
	select {
	case <-reg.Done():
		if err := reg.Err(); err != nil {
			return errors.Wrap(err, "registration ended")
		}
		return errors.New("deregistered")
	default:
		return nil
	}
}
