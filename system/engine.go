package system

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/driver"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// Re-exported message types: what Finish and Drop report.
type (
	// Result is a chunk context's outcome.
	Result = messages.Result
	// Status is how a chunk ended.
	Status = messages.Status
	// ChunkStats are a chunk's transfer figures.
	ChunkStats = messages.Stats
	// Peer is a decode session (see actors.Peer).
	Peer = actors.Peer
	// PeerBuffer is one decode buffer.
	PeerBuffer = actors.PeerBuffer
	// ChunkSpec is what the scheduler registers (see actors.ChunkSpec).
	ChunkSpec = actors.ChunkSpec
	// DecodeInfo is one decode destination of a room.
	DecodeInfo = actors.DecodeInfo
	// Mode is per-layer or monolithic.
	Mode = cp.Mode
	// Reason says why the register guard chose a mode.
	Reason = cp.Reason
)

// Statuses and modes.
const (
	Succeeded  = messages.Succeeded
	Failed     = messages.Failed
	Dropped    = messages.Dropped
	PerLayer   = cp.PerLayer
	Monolithic = cp.Monolithic
)

// Option configures an Engine beyond its Config.
type Option func(*options)

type options struct {
	gpu       *driver.Device
	gpuErr    error
	traceTo   io.Writer
	traceCap  int
	observers observers
	// started run at the end of New, with the engine (gauges, watchers).
	started   []func(*Engine)
	log       *zap.Logger
	stream    cuda.Stream
	transport rdma.Transport
	getenv    func(string) string
}

// WithLogger sets the logger. The default writes WARN and above to stderr,
// so failures are seen and successes are not (invariant 12).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// WithStream sets the compute stream events are recorded on. The default is
// a stream of a virtual GPU owned by the engine (see Engine.Stream).
func WithStream(s cuda.Stream) Option { return func(o *options) { o.stream = s } }

// WithGPU records the engine's events on a new stream of a real GPU (see
// hw/cuda/driver), and closes that stream when the engine closes. It takes
// driver.Open's results as they are, so that a missing driver library or
// device is New's error:
//
//	eng, err := system.New(cfg, system.WithGPU(driver.Open(0)))
//
// To record on a stream the serving stack already owns, use
// WithStream(dev.WrapStream(handle)) instead.
func WithGPU(dev *driver.Device, err error) Option {
	return func(o *options) { o.gpu, o.gpuErr = dev, err }
}

// WithTransport sets the transport. The default is a node of
// loopback.Default(), the process's in-memory fabric.
func WithTransport(t rdma.Transport) Option { return func(o *options) { o.transport = t } }

// WithObserver adds an observer (metrics, traces, reports).
func WithObserver(o Observer) Option {
	return func(op *options) { op.observers = append(op.observers, o) }
}

// WithGetenv replaces os.Getenv for the KVSTREAM_* variables (tests).
func WithGetenv(f func(string) string) Option { return func(o *options) { o.getenv = f } }

// Registration is what Register returns.
type Registration struct {
	Mode     Mode
	Reason   Reason // why the guard chose Mode
	Existing bool   // the chunk was already registered: nothing changed
	Chunk    messages.Chunk
}

// Engine is the prefill side of kvstream.
type Engine struct {
	cfg    Config
	log    *zap.Logger
	env    *actors.Env
	system *actor.ActorSystem
	stream cuda.Stream
	layout *actors.Layout

	boundary []bool // per hook layer: does it close a group?

	manager, forward, submitters, pool *actor.PID

	nextForward atomic.Uint64
	nextSerial  atomic.Uint64

	transport    rdma.Transport
	ownStream    interface{ Close() error } // a stream the engine created (WithGPU)
	regions      []rdma.Region
	ownGPU       *sim.GPU
	ownTransport bool

	obs      observers
	restarts *actors.RestartWindow
	ends     forwardEnds // recent end-of-forward events, for Finish

	trace     *trace.Recorder
	traceTo   io.Writer
	traceFile *os.File

	closeMu   sync.RWMutex // held for reading by calls, for writing by Close
	closed    bool
	closeDone chan struct{} // closed when the first Close has finished
	unhealthy atomic.Pointer[error]
}

// New starts an engine.
func New(cfg Config, opts ...Option) (*Engine, error) {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	cfg, err := cfg.withDefaults(o.getenv)
	if err != nil {
		return nil, err
	}
	if o.log == nil {
		o.log = defaultLogger()
	}
	e := &Engine{cfg: cfg, log: o.log, stream: o.stream, closeDone: make(chan struct{}),
		restarts: &actors.RestartWindow{Max: cfg.MaxRestarts, Window: cfg.RestartWindow}}
	if err := e.startTrace(&o, cfg.getenv(o.getenv)); err != nil {
		return nil, err
	}
	if o.gpuErr != nil {
		e.release()
		return nil, errors.Wrap(o.gpuErr, "WithGPU")
	}
	if o.gpu != nil && e.stream == nil {
		s, err := o.gpu.NewStream()
		if err != nil {
			e.release()
			return nil, errors.Wrap(err, "WithGPU: create the compute stream")
		}
		e.stream, e.ownStream = s, s
	}
	if e.stream == nil {
		e.ownGPU = sim.New(sim.Options{})
		e.stream = e.ownGPU.NewStream("compute")
	}
	tr := o.transport
	if tr == nil {
		if tr, err = loopback.Default().NewTransport(fmt.Sprintf("prefill-%d", engines.Add(1))); err != nil {
			e.release()
			return nil, err
		}
		e.ownTransport = true
	}
	e.transport = tr
	keys := make([]rdma.LocalKey, len(cfg.Buffers))
	for i, b := range cfg.Buffers {
		if b.ItemLen == 0 || b.Pages < 1 {
			e.release()
			return nil, badInput("buffer %d (%s): item length %d, %d pages", i, b.Name, b.ItemLen, b.Pages)
		}
		r, err := tr.Register(b.Base, b.ItemLen*uint64(b.Pages))
		if err != nil {
			e.release()
			return nil, errors.Wrapf(err, "register buffer %d (%s)", i, b.Name)
		}
		e.regions = append(e.regions, r)
		keys[i] = r.Key()
	}
	if e.layout, err = actors.NewLayout(cfg.Buffers, keys, cfg.HookLayers, cfg.GroupSize, cfg.PageSize, cfg.CP); err != nil {
		e.release()
		return nil, err
	}
	e.boundary = make([]bool, cfg.HookLayers)
	for l := range e.boundary {
		e.boundary[l] = e.layout.Groups.Boundary(l)
	}

	e.system = actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return protoactorLogger(e.log) }),
		actor.WithDeadLetterThrottleInterval(100*time.Millisecond),
	)
	e.env = &actors.Env{System: e.system, Log: e.log, Layout: e.layout, Peers: actors.NewPeers(), Transport: tr, Trace: e.trace,
		Registry: actors.NewRegistry(), Dispatcher: actors.NewDispatcher(0), Observer: o.observers}
	e.obs = o.observers
	root := e.system.Root
	if e.forward, err = root.SpawnNamed(actors.ForwardProps(e.env), "forward"); err == nil {
		e.env.Forward = e.forward
		e.submitters, e.pool, err = actors.SpawnSubmitters(e.env, actors.PoolConfig{
			Submitters: cfg.Submitters, Restarts: e.restarts, OnDeviceLost: e.markUnhealthy,
		})
	}
	if err == nil {
		e.env.Submitters = e.submitters
		e.manager, err = root.SpawnNamed(actors.ManagerProps(e.env), "manager")
		e.env.Manager = e.manager
	}
	if err != nil {
		e.stopActors()
		e.release()
		return nil, err
	}
	for _, f := range o.started {
		f(e)
	}
	return e, nil
}

var engines atomic.Uint64

func defaultLogger() *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(os.Stderr), zap.WarnLevel)).Named("kvstream")
}

// protoactorLogger routes protoactor's slog output into zap, keeping only
// WARN and above: its INFO (actor system started, dead letters of late
// completions after a teardown) is noise to a serving stack.
func protoactorLogger(l *zap.Logger) *slog.Logger {
	core, err := zapcore.NewIncreaseLevelCore(l.Named("protoactor").Core(), zap.WarnLevel)
	if err != nil { // the logger is already quieter than WARN
		core = l.Core()
	}
	return slog.New(zapslog.NewHandler(core))
}

// Stream returns the compute stream the engine records events on. When the
// engine owns a virtual GPU, the model launches its kernels there.
func (e *Engine) Stream() cuda.Stream { return e.stream }

// Transport returns the engine's transport.
func (e *Engine) Transport() rdma.Transport { return e.transport }

// Config returns the effective configuration (defaults and environment
// applied).
func (e *Engine) Config() Config { return e.cfg }

// Restarts returns how many times submitters restarted.
func (e *Engine) Restarts() int64 { return e.env.Restarts.Load() }

// ErrUnhealthy marks the error of a registration refused because the
// engine is unhealthy (a lost device, or a submitter restart storm).
var ErrUnhealthy = errors.New("engine unhealthy")

// Healthy returns nil, or why the engine refuses new registrations: the
// device error that poisoned the CUDA context (permanent, also marked
// ErrDeviceLost), or a submitter restart storm (until the restart rate
// falls back under Config.MaxRestarts per Config.RestartWindow).
func (e *Engine) Healthy() error {
	if p := e.unhealthy.Load(); p != nil {
		return *p
	}
	if e.restarts.Storm(time.Now()) {
		return errors.Mark(errors.Newf("engine unhealthy: more than %d submitter restarts within %v", e.cfg.MaxRestarts, e.cfg.RestartWindow), ErrUnhealthy)
	}
	return nil
}

func (e *Engine) markUnhealthy(err error) {
	err = errors.Mark(errors.Mark(errors.Wrap(err, "engine unhealthy"), cuda.ErrDeviceLost), ErrUnhealthy)
	e.unhealthy.CompareAndSwap(nil, &err)
}

// AddPeer adds a decode session. Its buffers must match the prefill layout
// one for one (same item lengths).
func (e *Engine) AddPeer(p Peer) error {
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		return closedError("AddPeer")
	}
	err := actors.ValidatePeer(e.layout, p)
	if err == nil {
		err = e.env.Peers.Add(&p)
	}
	e.traceAddPeer(&p, err)
	return err
}

// ErrPeerLost marks failures caused by a decode peer reported lost.
var ErrPeerLost = actors.ErrPeerLost

// PeerLost tells the engine a decode peer is gone (its process died, the
// control plane lost it): work for it fails at once instead of waiting for
// transport errors or timeouts, and new registrations to it are refused
// (ErrPeerLost, also ErrEndpointBroken). Chunks with writes in flight to it
// still quiesce before they answer.
func (e *Engine) PeerLost(id string, cause error) error {
	return e.env.Peers.Lose(id, cause)
}

// Register registers the chunk that the next forward writes, before that
// forward begins. It is idempotent per (room, exact chunk range):
// registering an active chunk again changes nothing and is cheap. It returns the mode the
// room uses: per-layer when it has exactly one non-dummy destination and
// per-layer is on, else monolithic.
func (e *Engine) Register(ctx context.Context, spec ChunkSpec) (reg Registration, err error) {
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	defer func() { e.traceRegister(&spec, reg, err) }()
	if e.closed {
		e.obs.Refused("closed")
		return Registration{}, closedError("Register")
	}
	key := spec.Key(e.cfg.PageSize, e.nextForward.Load())
	if a, ok := e.env.Registry.Lookup(key); ok {
		return registration(a, 0), nil
	}
	if err := e.Healthy(); err != nil {
		e.obs.Refused("unhealthy")
		return Registration{}, err
	}
	for _, in := range spec.Infos {
		if lost := e.env.Peers.Lost(in.Peer); lost != nil && !in.Dummy {
			e.obs.Refused("peer_lost")
			return Registration{}, lost
		}
	}
	plan, err := actors.BuildPlan(e.layout, e.env.Peers.Get, &spec, !e.cfg.DisablePerLayer)
	if err != nil {
		e.obs.Refused("bad_input")
		return Registration{}, err
	}
	plan.Chunk = messages.Chunk{ChunkKey: key, Serial: e.nextSerial.Add(1)}
	job := actors.NewJob(plan)
	reply := make(chan messages.Added, 1)
	e.system.Root.Send(e.manager, &messages.AddChunk{
		Chunk: plan.Chunk, PerLayer: plan.Mode == cp.PerLayer, Owned: plan.Owned, Dests: len(plan.Dests),
		Props: actors.ChunkProps(e.env, job), Reply: reply,
	})
	select {
	case a := <-reply:
		reg := registration(a, plan.Reason)
		if a.Existing {
			job.Release()
		} else {
			e.obs.Registered(reg)
		}
		return reg, nil
	case <-ctx.Done():
		// The registration still completes; the caller may retry, which is
		// idempotent.
		return Registration{}, errors.Wrapf(ctx.Err(), "register room %d chunk %d", spec.Room, spec.Start)
	}
}

func registration(a messages.Added, r Reason) Registration {
	m := Monolithic
	if a.PerLayer {
		m = PerLayer
	}
	return Registration{Mode: m, Reason: r, Existing: a.Existing, Chunk: a.Chunk}
}

// finishGrace bounds how long Finish waits past the chunk's own deadline for
// its answer: the chunk answers at its deadline after a teardown, so only a
// bug can use this margin. It keeps "never hang" true even then.
const finishGrace = 5 * time.Second

// Finish waits for the room's front chunk (chunks finish in send order) and
// returns its result. It returns within the finish timeout (or ctx's
// deadline, if sooner), and only when no write of the chunk can land any
// more. A failed chunk returns its result and an error marked with its
// class (ErrTimeout, ErrEndpointBroken, ErrEventWait, ErrDeviceLost); an
// unknown room returns an error marked ErrBadInput. If ctx is cancelled the
// chunk fails (and still quiesces before Finish returns).
func (e *Engine) Finish(ctx context.Context, room uint64) (Result, error) {
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		return Result{}, closedError("Finish")
	}
	timeout := e.cfg.FinishTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(dl), time.Millisecond))
	}
	call := time.Now()
	ev, evErr := e.stream.Record()
	reply := make(chan Result, 1)
	e.system.Root.Send(e.manager, &messages.Finish{Room: room, Timeout: timeout, Ctx: ctx, Event: ev, EventErr: evErr, Reply: reply})
	select {
	case r := <-reply:
		if r.Chunk.Serial != 0 { // a chunk answered (not an unknown room)
			ret := time.Now()
			ph, ok := e.exposure(&r, ret)
			e.obs.Finished(FinishRecord{Result: r, Latency: ret.Sub(call), Exposed: r.Stats.Exposed, Phases: ph, HasPhases: ok, Returned: ret})
		}
		return r, r.Err
	case <-time.After(timeout + finishGrace):
		return Result{}, errors.AssertionFailedf("room %d: the engine did not answer Finish within %v (a bug)", room, timeout+finishGrace)
	}
}

// Drop aborts every queued chunk of the room (abort or failure on the
// serving side). It returns when none of their writes can land any more, so
// their decode pages may be reused; within the finish timeout. Dropping an
// unknown room is an error marked ErrBadInput. An error marked
// ErrNotQuiesced says a chunk's teardown could not stop its writes (see
// Finish): those pages must not be reused.
func (e *Engine) Drop(ctx context.Context, room uint64) error {
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		return closedError("Drop")
	}
	return e.drop(ctx, room)
}

func (e *Engine) drop(ctx context.Context, room uint64) error {
	timeout := e.cfg.FinishTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(dl), time.Millisecond))
	}
	reply := make(chan []Result, 1)
	e.system.Root.Send(e.manager, &messages.Drop{Room: room, Timeout: timeout, Reply: reply})
	select {
	case rs := <-reply:
		if len(rs) == 1 && rs[0].Chunk.Serial == 0 && rs[0].Err != nil {
			return rs[0].Err
		}
		// A dropped chunk fails by design; what the caller must hear is a
		// teardown that could not quiesce: those pages must not be reused.
		var err error
		for _, r := range rs {
			if errors.Is(r.Err, ErrNotQuiesced) {
				err = errors.CombineErrors(err, r.Err)
			}
		}
		return err
	case <-time.After(timeout + finishGrace):
		return errors.AssertionFailedf("room %d: the engine did not answer Drop within %v (a bug)", room, timeout+finishGrace)
	}
}

// HasRoom reports whether the room has a live chunk context.
func (e *Engine) HasRoom(room uint64) bool { return e.env.Registry.HasRoom(room) }

// Close drops every room (so that nothing lands after it returns), stops the
// actors and releases what the engine owns. Later calls return ErrClosed.
// An error marked ErrNotQuiesced names rooms whose writes could not be
// stopped (see Drop).
func (e *Engine) Close() error {
	e.closeMu.Lock()
	if e.closed {
		e.closeMu.Unlock()
		// A Close is under way: return when it is over, since our caller
		// too may free what the rooms' writes target.
		<-e.closeDone
		return nil
	}
	e.closed = true
	e.closeMu.Unlock()
	defer close(e.closeDone)
	var err error
	for _, room := range e.env.Registry.Rooms() {
		if derr := e.drop(context.Background(), room); errors.Is(derr, ErrNotQuiesced) {
			err = errors.CombineErrors(err, derr)
		}
	}
	e.stopActors()
	err = errors.CombineErrors(err, e.closeTrace()) // the actors stopped: the trace is complete
	e.release()
	return err
}

func (e *Engine) stopActors() {
	root := e.system.Root
	for _, pid := range []*actor.PID{e.manager, e.submitters, e.pool, e.forward} {
		if pid != nil {
			_ = root.StopFuture(pid).Wait()
		}
	}
	e.env.Dispatcher.Close()
	e.system.Shutdown()
}

func (e *Engine) release() {
	if e.traceFile != nil { // New failed after opening KVSTREAM_TRACE
		_ = e.traceFile.Close()
		e.traceFile = nil
	}
	for _, r := range e.regions {
		_ = r.Deregister()
	}
	e.regions = nil
	if e.ownTransport {
		_ = e.transport.Close()
	}
	if e.ownGPU != nil {
		e.ownGPU.Close()
	}
	if e.ownStream != nil {
		_ = e.ownStream.Close()
		e.ownStream = nil
	}
}
