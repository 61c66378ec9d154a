package system

import (
	"context"
	"io"
	"log/slog"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// Engine is the prefill side of kvstream.
type Engine struct {
	cfg Config
	// grace is finishGrace; a test shortens it (at most finishGrace: the
	// bound on timeouts leaves room for that much).
	grace  time.Duration
	log    *zap.Logger
	env    *actors.Env
	system *actor.ActorSystem
	stream cuda.Stream
	layout *plan.Layout

	boundary []bool // per hook layer: does it close a group?

	manager, forward, submitters, pool *actor.PID

	nextForward atomic.Uint64
	nextSerial  atomic.Uint64

	transport    rdma.Transport
	ownStream    interface{ Close() error } // a stream the engine created (WithGPU)
	regions      []rdma.Region
	releaseHW    func() // what WithHardware's stream needs to release it
	ownTransport bool

	obs        observers
	onDraining []func(peer, reason string) // WithPeerDraining
	// onCancelled: WithRoomCancelled
	onCancelled []func(peer string, room uint64, reason string)
	cancels     cancelledRooms // rooms decode peers cancelled (CancelRoom)
	// removing are the decode peers whose removal waits for their last
	// live chunk (RemovePeerWhenIdle), with the record each was marked on;
	// guarded by cancels.mu, the registration lock.
	removing map[string]*plan.Peer
	restarts *actors.RestartWindow
	ends     forwardEnds // recent end-of-forward events, for Finish

	trace     *trace.Recorder
	traceTo   io.Writer
	traceFile *os.File
	traceCfg  trace.Config // the trace's header: what its records are checked against

	closeMu sync.Mutex // orders the Close calls
	closed  bool
	// calls are the calls in flight (enter to leave), which Close waits
	// for as it begins; from then on a call returns ErrClosed. Not a read
	// lock held by calls: a call made while Close waited for the write
	// lock queued behind it, and one made by a callback the engine runs
	// inside a call (WithRoomCancelled, WithPeerDraining) deadlocked Close.
	calls gate
	// records are the forward loop's Records on the stream (a boundary's
	// LayerEnd, End), which Close waits for before it releases the stream
	// (WithGPU's is destroyed). Not calls: a Finish that Close waits for
	// may wait for its forward's End.
	records gate
	// gone is closed, for readers that must not wait for Close (a scrape).
	gone      atomic.Bool
	closeDone chan struct{} // closed when the first Close has finished
	unhealthy atomic.Pointer[error]
}

// New starts an engine: it opens the compute stream and the transport,
// registers the prefill pool, and spawns the actors. On error, whatever it
// had opened is released.
func New(cfg Config, opts ...Option) (_ *Engine, err error) {
	defer func() { err = public(err) }()
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if cfg, err = cfg.withDefaults(o.getenv); err != nil {
		return nil, err
	}
	if o.log == nil {
		o.log = defaultLogger()
	}
	e := &Engine{cfg: cfg, grace: finishGrace, log: o.log, stream: o.stream, closeDone: make(chan struct{}), obs: o.observers, onDraining: o.draining, onCancelled: o.cancelled,
		restarts: &actors.RestartWindow{Max: cfg.MaxRestarts, Window: cfg.RestartWindow}}
	defer func() {
		if err != nil {
			e.stopActors()
			e.release()
		}
	}()
	if err = e.startTrace(&o, cfg.getenv(o.getenv)); err != nil {
		return nil, err
	}
	if err = e.openHardware(&o); err != nil {
		return nil, err
	}
	keys, err := e.registerPool()
	if err != nil {
		return nil, err
	}
	if e.layout, err = plan.NewLayout(cfg.Buffers, keys, cfg.HookLayers, cfg.GroupSize, cfg.PageSize, cfg.CP); err != nil {
		return nil, err
	}
	if cfg.Sharding != nil {
		if err = e.layout.SetSharding(cfg.Sharding, cfg.Replicas); err != nil {
			return nil, err
		}
	}
	e.boundary = make([]bool, cfg.HookLayers)
	for l := range e.boundary {
		e.boundary[l] = e.layout.Groups.Boundary(l)
	}
	if err = e.spawnActors(); err != nil {
		return nil, err
	}
	for _, f := range o.started {
		f(e)
	}
	return e, nil
}

// openHardware sets the compute stream and the transport: the caller's, or
// ones the engine owns and releases.
func (e *Engine) openHardware(o *options) error {
	if o.gpuErr != nil {
		return errors.Wrap(o.gpuErr, "WithGPU")
	}
	if o.gpu != nil && e.stream == nil {
		s, err := o.gpu.NewStream()
		if err != nil {
			return errors.Wrap(err, "WithGPU: create the compute stream")
		}
		e.stream, e.ownStream = s, s
	}
	switch {
	case e.stream == nil && o.hardware == nil:
		return badInput("no compute stream: pass WithStream or WithGPU (or WithHardware(simulated.Hardware()) for a virtual GPU)")
	case o.transport == nil && o.hardware == nil:
		return badInput("no transport: pass WithTransport (or WithHardware(simulated.Hardware()) for the in-process loopback fabric)")
	}
	if e.stream == nil {
		s, release, err := o.hardware.Stream()
		if err != nil {
			return errors.Wrap(err, "WithHardware: the compute stream")
		}
		e.stream, e.releaseHW = s, release
	}
	e.transport = o.transport
	if e.transport == nil {
		tr, err := o.hardware.Transport()
		if err != nil {
			return errors.Wrap(err, "WithHardware: the transport")
		}
		e.transport, e.ownTransport = tr, true
	}
	return nil
}

// registerPool registers every prefill buffer with the transport and
// returns their local keys, in buffer order. Every buffer is checked before
// any is registered: a bad one is an error that names it (index and name)
// and its value, and registers nothing.
func (e *Engine) registerPool() ([]rdma.LocalKey, error) {
	lens := make([]uint64, len(e.cfg.Buffers))
	for i, b := range e.cfg.Buffers {
		n, err := bufferLen(i, b)
		if err != nil {
			return nil, err
		}
		lens[i] = n
	}
	keys := make([]rdma.LocalKey, len(e.cfg.Buffers))
	for i, b := range e.cfg.Buffers {
		r, err := rdma.RegisterMemory(e.transport, b.Base, lens[i], b.Memory)
		if err != nil {
			return nil, errors.Wrapf(err, "register buffer %d (%s, %s memory)", i, b.Name, b.Memory)
		}
		e.regions = append(e.regions, r)
		keys[i] = r.Key()
	}
	return keys, nil
}

// bufferLen is the bytes buffer i spans, ItemLen × Pages, checked: both
// within their bounds (MaxItemLen, MaxPages), a product that does not wrap
// (math/bits.Mul64: a wrapped one registered a few bytes while the layout
// addressed pages far beyond them), and an end within the address space.
func bufferLen(i int, b Buffer) (uint64, error) {
	switch {
	case b.ItemLen == 0 || b.Pages < 1:
		return 0, badInput("buffer %d (%s): item length %d, %d pages", i, b.Name, b.ItemLen, b.Pages)
	case b.ItemLen > MaxItemLen:
		return 0, badInput("buffer %d (%s): item length %d: must be at most %d", i, b.Name, b.ItemLen, MaxItemLen)
	case b.Pages > MaxPages:
		return 0, badInput("buffer %d (%s): %d pages: must be at most %d", i, b.Name, b.Pages, MaxPages)
	}
	hi, n := bits.Mul64(b.ItemLen, uint64(b.Pages))
	switch {
	case hi != 0:
		return 0, badInput("buffer %d (%s): item length %d × %d pages overflows 64 bits", i, b.Name, b.ItemLen, b.Pages)
	case b.Base+n < b.Base:
		return 0, badInput("buffer %d (%s): [%#x, +%d) wraps around the address space", i, b.Name, b.Base, n)
	}
	return n, nil
}

// spawnActors starts the actor system: the forward actor, the submitter
// pool and the manager.
func (e *Engine) spawnActors() (err error) {
	e.system = actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return protoactorLogger(e.log) }),
		actor.WithDeadLetterThrottleInterval(100*time.Millisecond),
	)
	e.env = &actors.Env{System: e.system, Log: e.log, Layout: e.layout, Peers: actors.NewPeers(), Transport: e.transport, Trace: e.trace,
		Registry: actors.NewRegistry(), Dispatcher: actors.NewDispatcher(0), Observer: e.obs}
	e.env.Registry.OnPeerIdle(e.peerIdle)
	root := e.system.Root
	if e.forward, err = root.SpawnNamed(actors.ForwardProps(e.env), "forward"); err != nil {
		return err
	}
	e.env.Forward = e.forward
	if e.submitters, e.pool, err = actors.SpawnSubmitters(e.env, actors.PoolConfig{
		Submitters: e.cfg.Submitters, Restarts: e.restarts, OnDeviceLost: e.markUnhealthy,
	}); err != nil {
		return err
	}
	e.env.Submitters = e.submitters
	e.manager, err = root.SpawnNamed(actors.ManagerProps(e.env), "manager")
	e.env.Manager = e.manager
	return err
}

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

// GroupSize is the group size K the engine runs with: Config.GroupSize, its
// default, or what Config.AutoGroup chose.
func (e *Engine) GroupSize() int { return e.cfg.GroupSize }

// GroupChoice is what Config.AutoGroup chose and why, or nil without it.
func (e *Engine) GroupChoice() *GroupChoice { return e.cfg.chosen }

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
		return public(*p)
	}
	if e.restarts.Storm(time.Now()) {
		return public(errors.Mark(errors.Newf("engine unhealthy: more than %d submitter restarts within %v", e.cfg.MaxRestarts, e.cfg.RestartWindow), ErrUnhealthy))
	}
	return nil
}

func (e *Engine) markUnhealthy(err error) {
	err = errors.Mark(errors.Mark(errors.Wrap(err, "engine unhealthy"), cuda.ErrDeviceLost), ErrUnhealthy)
	e.unhealthy.CompareAndSwap(nil, &err)
}

// Close drops every room (so that nothing lands after it returns), stops the
// actors and releases what the engine owns. Later calls return ErrClosed.
// An error marked ErrNotQuiesced names rooms whose writes could not be
// stopped (see Drop).
//
// Close takes no context because it must not return early: the caller frees
// what the rooms' writes target once it returns. Its bound is the finish
// timeout (Config.FinishTimeout) per room still queued, dropped one after
// the other, plus stopping the actors; a second Close waits for the first.
func (e *Engine) Close() (err error) {
	defer func() { err = public(err) }()
	e.closeMu.Lock()
	if e.closed {
		e.closeMu.Unlock()
		// A Close is under way: return when it is over, since our caller
		// too may free what the rooms' writes target.
		<-e.closeDone
		return nil
	}
	e.closed = true
	e.gone.Store(true)
	e.closeMu.Unlock()
	defer close(e.closeDone)
	// The calls in flight (a Finish, up to its timeout) end first; a call
	// from now on, a callback's included, returns ErrClosed.
	e.calls.close()
	for _, room := range e.env.Registry.Rooms() {
		if derr := e.drop(context.Background(), room); errors.Is(derr, ErrNotQuiesced) {
			err = errors.CombineErrors(err, derr)
		}
	}
	e.stopActors()
	err = errors.CombineErrors(err, e.closeTrace()) // the actors stopped: the trace is complete
	e.records.close()
	e.release()
	return err
}

// enter admits a call unless Close began; the caller calls leave when it
// returns.
func (e *Engine) enter() bool { return e.calls.enter() }

// leave ends a call enter admitted.
func (e *Engine) leave() { e.calls.leave() }

// gate counts what is in flight and, once closed, admits nothing more:
// close returns when what it admitted left. Lock-free: enter is on every
// call's path (Register runs about nine times per request).
type gate struct {
	n       atomic.Int64 // in flight, and gateClosed once closed
	drained chan struct{}
	once    sync.Once
}

// gateClosed is the bit of gate.n that says it is closed.
const gateClosed = 1 << 62

func (g *gate) init() { g.once.Do(func() { g.drained = make(chan struct{}) }) }

func (g *gate) enter() bool {
	for {
		n := g.n.Load()
		if n&gateClosed != 0 {
			return false
		}
		if g.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// leave ends what enter admitted; the last to leave a closed gate lets
// close return.
func (g *gate) leave() {
	if g.n.Add(-1) == gateClosed {
		g.init()
		close(g.drained)
	}
}

// close admits nothing more and waits for what is in flight; one caller.
func (g *gate) close() {
	g.init()
	if g.n.Or(gateClosed) != 0 {
		<-g.drained
	}
}

func (e *Engine) stopActors() {
	if e.system == nil { // New failed before it started the actors
		return
	}
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
	if e.releaseHW != nil {
		e.releaseHW()
		e.releaseHW = nil
	}
	if e.ownStream != nil {
		_ = e.ownStream.Close()
		e.ownStream = nil
	}
}
