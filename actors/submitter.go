package actors

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/router"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/stderrs"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
)

// ErrEventWait marks a failed wait on a group's CUDA event.
var ErrEventWait = errors.New("event wait failed")

// endpointFailure is the panic value a submitter restarts with after an
// endpoint broke, so that its supervisor gives it fresh endpoints.
type endpointFailure struct {
	peer string
	err  error
}

func (f endpointFailure) Error() string { return "endpoint to " + f.peer + " broken: " + f.err.Error() }

// deviceFailure is the panic value a submitter escalates with when the CUDA
// context is lost: nothing a restart can fix.
type deviceFailure struct{ err error }

func (f deviceFailure) Error() string { return "device lost: " + f.err.Error() }

// PoolConfig configures the submitter pool.
type PoolConfig struct {
	Submitters int
	// Restarts counts restarts; more than its Max within its Window is a
	// restart storm (see RestartWindow).
	Restarts *RestartWindow
	// OnDeviceLost is called (once per failure) when a submitter meets a
	// device error that poisons the CUDA context.
	OnDeviceLost func(error)
	// FIFO posts ready Works in arrival order instead of the most urgent
	// first (see Urgency): the behaviour before send-by-deadline, for tests.
	FIFO bool

	hub *readyHub // the pool's ready hub, when a test watches it
}

// SpawnSubmitters starts the pool: a supervisor actor whose children are the
// submitters, and a protoactor round-robin group router over them. It returns
// the router (where Work goes) and the supervisor (to stop the pool).
func SpawnSubmitters(env *Env, cfg PoolConfig) (routerPID, supervisor *actor.PID, err error) {
	observe := func(reason any) {
		if cfg.Restarts.Add(time.Now()) {
			env.Log.Warn("submitter restart storm: the engine refuses new registrations until it calms down",
				zap.Int("max_restarts", cfg.Restarts.Max), zap.Duration("window", cfg.Restarts.Window))
		}
		switch r := reason.(type) {
		case endpointFailure:
			env.Restarts.Add(1)
			env.Observer.Restarted("endpoint")
			env.Log.Warn("submitter restarting with fresh endpoints", zap.String("peer", r.peer), stderrs.WarnField(r.err))
		case deviceFailure:
			if cfg.OnDeviceLost != nil {
				cfg.OnDeviceLost(r.err)
			}
			env.Restarts.Add(1)
			env.Observer.Restarted("device")
			env.Log.Warn("submitter met a lost device; restarting, engine marked unhealthy", stderrs.WarnField(r.err))
		default:
			env.Restarts.Add(1)
			env.Observer.Restarted("panic")
			env.Log.Warn("submitter failed; restarting", zap.Any("reason", reason))
		}
	}
	ready := make(chan []*actor.PID, 1)
	hub := cfg.hub
	if hub == nil {
		hub = newReadyHub(cfg.FIFO)
	}
	// The submitters run on workers of their own, one per submitter, not on
	// a goroutine started per mailbox activation (protoactor's default): a
	// post goes deep into the transport, and a fresh goroutine's stack
	// would grow (be copied) on the way at every post, on the batch's
	// critical path; a long-lived worker's stack has grown once. With one
	// worker per submitter, a submitter that blocks (a first connect, an
	// endpoint's close) holds only its own worker, and only the Work it
	// connects for: serve puts the others it took back (serve).
	disp := NewDispatcher(cfg.Submitters)
	// Per submitter index, not per instance: a restarted submitter answers
	// the resumes its predecessor's Works asked for.
	resuming := make([]atomic.Bool, cfg.Submitters)
	// Pool-wide: the endpoints restarted submitters retired, which a
	// PeerLost must close too.
	retired := &retiredConns{}
	props := actor.PropsFromFunc(func(ctx actor.Context) {
		switch ctx.Message().(type) {
		case *actor.Started:
			pids := make([]*actor.PID, cfg.Submitters)
			for i := range pids {
				pids[i] = ctx.SpawnPrefix(actor.PropsFromProducer(func() actor.Actor {
					return &submitter{env: env, ready: hub, index: i, resuming: &resuming[i], retired: retired, conns: map[string]*conn{}}
				}, env.props(actor.WithDispatcher(disp))...), "submitter")
			}
			ready <- pids
		case *actor.Stopped: // after the submitters stopped
			disp.Close()
		}
	}, actor.WithSupervisor(restartAlways(observe)))
	supervisor, err = env.System.Root.SpawnNamed(props, "submitters")
	if err != nil {
		disp.Close()
		return nil, nil, errors.Wrap(err, "spawn submitter pool")
	}
	pids := <-ready
	routerPID, err = env.System.Root.SpawnNamed(router.NewRoundRobinGroup(pids...), "submit-router")
	if err != nil {
		_ = env.System.Root.StopFuture(supervisor).Wait() // its Stopped closes disp
		return nil, nil, errors.Wrap(err, "spawn submitter router")
	}
	return routerPID, supervisor, nil
}

// restartAlways restarts a failed submitter every time, after letting
// observe count and log the failure. A stopped submitter would silently
// lose the work the router keeps sending it; a restart storm is reported
// through the engine's health instead (see RestartWindow).
type restartAlways func(reason any)

func (observe restartAlways) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, _ any) {
	observe(reason)
	sup.RestartChildren(child)
}

// submitter waits a group's event, builds its blocks and posts one batch;
// what a Work comes to (posted, skipped, failed, retried, restart,
// escalate) is its SubmitCore's decision. Waiting blocks this actor's wait
// goroutine only: never the forward thread, never the compute stream
// (invariant 1).
type submitter struct {
	env   *Env
	ready *readyHub // shared by the pool
	index int
	// resuming: a resume is on its way to this submitter; the Works that
	// become ready meanwhile ask for no other (it takes them all).
	resuming *atomic.Bool
	retired  *retiredConns // the pool's, shared by every submitter
	conns    map[string]*conn
	blocks   []cp.Block
	writes   []rdma.Write
	taken    []*readyWork // reused by resume
	wake     func()       // asks this submitter for a resume (start)
	serving  []served     // reused by serve
}

type conn struct {
	peer  string
	rec   *plan.Peer // the record it connected for: a peer removed and added again is another
	ep    rdma.Endpoint
	keys  []rdma.RemoteKey // per buffer
	bases []uint64         // per buffer: the peer's page 0

	inflight atomic.Int64 // batches posted on ep and not completed
	retired  atomic.Bool  // close ep once nothing is in flight
	set      *retiredConns
	closed   atomic.Bool // shut: not a Once, since the Close may fail its batches, whose done comes back here
}

// retire closes the endpoint once its batches in flight completed: a
// restarted submitter gets fresh endpoints without failing other chunks'
// writes that are still landing on a healthy one. Until then it is in rs,
// where a PeerLost finds it.
func (c *conn) retire(rs *retiredConns) {
	c.set = rs // before retired: completed reads it once it sees retired
	rs.add(c)
	c.retired.Store(true)
	if c.inflight.Load() == 0 {
		c.shut()
	}
}

func (c *conn) completed() {
	if c.inflight.Add(-1) == 0 && c.retired.Load() {
		c.shut()
	}
}

// shut closes a retired endpoint, once, and forgets it.
func (c *conn) shut() {
	if c.closed.Swap(true) {
		return
	}
	_ = c.ep.Close()
	c.set.remove(c)
}

// retiredConns are the endpoints restarted submitters retired and that
// still have batches in flight. A PeerLost closes those to the lost peer
// as it closes the current submitters' ones: a decode that crashed is
// when submitters restart (its endpoints break), and a retired endpoint's
// batch to it would otherwise hold its chunk until its completion deadline
// or its finish timeout.
type retiredConns struct {
	mu    sync.Mutex
	conns map[*conn]struct{}
}

func (rs *retiredConns) add(c *conn) {
	if rs == nil { // a submitter outside a pool (tests)
		return
	}
	rs.mu.Lock()
	if rs.conns == nil {
		rs.conns = map[*conn]struct{}{}
	}
	rs.conns[c] = struct{}{}
	rs.mu.Unlock()
}

func (rs *retiredConns) remove(c *conn) {
	if rs == nil {
		return
	}
	rs.mu.Lock()
	delete(rs.conns, c)
	rs.mu.Unlock()
}

// closeRecord closes the retired endpoints made for a peer record.
func (rs *retiredConns) closeRecord(rec *plan.Peer) {
	rs.closeWhere(func(c *conn) bool { return c.rec == rec })
}

// closeWhere closes the retired endpoints that match.
func (rs *retiredConns) closeWhere(match func(*conn) bool) {
	if rs == nil {
		return
	}
	rs.mu.Lock()
	var to []*conn
	for c := range rs.conns {
		if match(c) {
			to = append(to, c)
		}
	}
	rs.mu.Unlock()
	for _, c := range to {
		c.shut() // without rs.mu: the Close may fail batches, whose done calls completed
	}
}

// TraceIdentity implements trace.Traced.
func (s *submitter) TraceIdentity() (string, string) { return trace.Submitter, strconv.Itoa(s.index) }

// TraceEffects implements trace.Traced: a Work only starts a wait; what it
// leads to is recorded when the submitter resumes (its Waited).
func (s *submitter) TraceEffects() []any { return nil }

func (s *submitter) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Restarting:
		for id, c := range s.conns {
			c.retire(s.retired)
			delete(s.conns, id)
		}
	case *actor.Stopping:
		s.closeAll()
	case *Work:
		s.start(ctx, m)
	case *resume:
		s.resume(ctx)
	case *messages.PeerLost:
		s.peerLost(m)
	case *forgetPeer:
		if c, ok := s.conns[m.peer]; ok && c.rec == m.rec {
			s.disconnect(m.peer)
		}
		s.retired.closeRecord(m.rec)
	}
}

// ForgetPeer closes every submitter's endpoint made for a peer record the
// engine forgot (Engine.RemovePeer): nothing sends to it any more, and a
// decode session that ended leaves no connection behind. Only the
// endpoints of that record: a submitter that hears of it late may already
// have connected to the peer added again under its id (a decode server that
// restarted), whose endpoint is not the old session's.
func ForgetPeer(env *Env, peer string, rec *plan.Peer) {
	env.send(env.Submitters, &router.BroadcastMessage{Message: &forgetPeer{peer: peer, rec: rec}})
}

// forgetPeer is ForgetPeer's message to each submitter.
type forgetPeer struct {
	peer string
	rec  *plan.Peer
}

// Unrecorded implements trace.Unrecorded: the RemovePeer call is recorded,
// and no core decides anything of it.
func (*forgetPeer) Unrecorded() {}

// PeerLost closes every submitter's endpoint to a lost peer: the batches in
// flight on them fail at once, and with them their chunks (closed, and
// quiesced by the transport's Close), instead of waiting out their
// timeouts for a peer that will never answer. Only the endpoints made for
// rec, the record lost: a submitter that hears of it late may have
// connected to the peer added again under its id since.
func PeerLost(env *Env, peer string, rec *plan.Peer) {
	env.send(env.Submitters, &router.BroadcastMessage{Message: &messages.PeerLost{Peer: peer, Record: rec}})
}

// waited is how a group's event wait ended.
type waited struct {
	err        error
	start, end time.Time
}

// start waits the Work's event without blocking the mailbox: the wait runs
// off it (readyHub: one goroutine per event, shared by the Works on it), and
// when it ends the submitter gets a resume and posts. So one chunk's event
// (a hung kernel, a wait that only its own cancellation ends) never holds up
// another chunk's work queued on the same submitter; posts stay serialized
// per submitter. (A plain message to itself rather than a future and
// ReenterAfter: no future to register and retire per Work, 15% fewer
// allocations per Work in BenchmarkFinishAfterLanded, and a resume reaches
// the instance that is current when it arrives, a restarted one with fresh
// endpoints included.)
func (s *submitter) start(ctx actor.Context, w *Work) {
	if s.wake == nil {
		// One per submitter instance, not per Work. It holds no instance:
		// a restarted submitter keeps its PID and its index's flag, and
		// answers the resumes its predecessor's Works ask for.
		root, self, resuming := ctx.ActorSystem().Root, ctx.Self(), s.resuming
		s.wake = func() {
			if !resuming.Swap(true) {
				root.Send(self, resumeMsg)
			}
		}
	}
	s.ready.add(w, time.Now(), s.wake)
}

// resume tells a submitter that a Work's wait ended: it posts the most
// urgent Work that is ready, which may have reached another submitter.
type resume struct{}

// Unrecorded implements trace.Unrecorded: the Work posted is recorded as
// its Waited.
func (*resume) Unrecorded() {}

var resumeMsg = &resume{}

// ServeLimit is the most Works a submitter takes from the ready queue at
// once. The Works that one event makes ready together (a group of every
// chunk of a forward, every chunk's rest at its end) are served by the
// submitters that take them, up to this many per take, each posted as its
// own batch: one resume message per take, not one per Work.
const ServeLimit = 32

// resumeRounds bounds how many rounds of ServeLimit Works one resume serves
// before it lets the submitter's mailbox in (a PeerLost, new Works).
const resumeRounds = 8

// resume serves the ready Works, the most urgent first, whichever
// submitter received them, until none is ready (or resumeRounds rounds:
// then it asks for another resume).
func (s *submitter) resume(ctx actor.Context) {
	s.resuming.Store(false) // before taking: a Work queued from now on asks again
	for range resumeRounds {
		s.taken = s.ready.takeUpTo(s.taken[:0], ServeLimit)
		if len(s.taken) == 0 {
			return
		}
		s.serve(ctx, s.taken)
		clear(s.taken)
	}
	if !s.resuming.Swap(true) {
		ctx.Send(ctx.Self(), resumeMsg)
	}
}

// served is one Work being served: its core, its answer, its batch record.
// The submitter keeps them from one serve to the next (serving), and with
// them their cores' arrays of effects.
type served struct {
	w       *Work
	wt      waited
	core    SubmitCore
	res     *messages.Submitted
	rec     Batch
	effs    []Effect
	failure error
}

// reuse makes x the serving of w toward peer, keeping its core's array of
// effects.
func (x *served) reuse(w *Work, wt waited, peer string) {
	core := x.core
	*x = served{w: w, wt: wt, core: core}
	x.core.reset(peer)
}

// release lets go of what x's Work referenced, keeping its core's array
// of effects for the next.
func (x *served) release() { x.reuse(nil, waited{}, "") }

// serve carries out what each Work's SubmitCore decides (carry), each
// posted as its own batch, and answers each chunk, in order, before a
// restart or an escalation panics.
func (s *submitter) serve(ctx actor.Context, ready []*readyWork) {
	sv := s.serving[:0]
	var failure error
	for i := 0; i < len(ready); i++ {
		rw := ready[i]
		w := rw.w
		dest := &w.Job.Plan.Dests[w.Dest]
		if _, ok := s.conns[dest.Peer]; !ok && i+1 < len(ready) && s.env.Peers.Lost(dest.Peer) == nil {
			// This Work's post connects first (a first use, or after a
			// restart), which may block: the Works after it go back to the
			// queue for the other submitters, so that a connect holds up
			// only its own Work.
			s.ready.requeue(ready[i+1:])
			ready = ready[:i+1]
		}
		if len(sv) < cap(sv) {
			sv = sv[:len(sv)+1]
		} else {
			sv = append(sv, served{})
		}
		x := &sv[len(sv)-1]
		x.reuse(w, rw.wt, dest.Peer)
		x.res = &messages.Submitted{Seq: w.Seq, Dest: w.Dest, WaitStart: rw.wt.start, WaitEnd: rw.wt.end}
		x.rec = Batch{Chunk: w.Chunk, Seq: w.Seq, Dest: w.Dest, Submitter: s.index, WaitStart: rw.wt.start, WaitEnd: rw.wt.end, EventDone: eventDone(w.Event)}
		x.effs = x.core.Step(&WaitEnded{Err: rw.wt.err, Cancelled: w.Job.Context().Err() != nil, PeerLost: s.env.Peers.Lost(dest.Peer)})
		s.carry(x)
		s.env.Queued.Add(-1)
		if rec := s.env.Trace; rec != nil {
			rec.Add(trace.Submitter, strconv.Itoa(s.index), "", &trace.Waited{Chunk: trace.ChunkID(w.Chunk), Seq: w.Seq, Dest: w.Dest, Err: errText(rw.wt.err)},
				trace.Effects([]any{x.res}))
		}
		// Answer before panicking: a message that panics is lost on
		// restart, and the chunk must hear about its work.
		ctx.Send(w.ReplyTo, x.res)
		if failure = x.failure; failure != nil {
			// The Works not served yet go back to the queue, for the
			// restarted submitter (or another) to serve.
			s.ready.requeue(ready[i+1:])
			break
		}
	}
	for i := range sv {
		sv[i].release()
	}
	s.serving = sv[:0]
	if failure != nil {
		// The resume being handled is lost with the panic, and with it
		// the rounds it had left: Works may still be queued that no
		// resume will come for. The restarted submitter gets one.
		s.resuming.Store(true)
		ctx.Send(ctx.Self(), resumeMsg)
		panic(failure)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (s *submitter) disconnect(peer string) {
	if c, ok := s.conns[peer]; ok {
		_ = c.ep.Close()
		delete(s.conns, peer)
	}
}

// peerLost closes every endpoint of the submitter to the lost peer, and
// those a restarted submitter retired: those made for the record lost,
// when the message names it.
func (s *submitter) peerLost(m *messages.PeerLost) {
	rec, _ := m.Record.(*plan.Peer)
	lost := func(c *conn) bool { return c.peer == m.Peer && (rec == nil || c.rec == rec) }
	if c, ok := s.conns[m.Peer]; ok && lost(c) {
		s.disconnect(m.Peer)
	}
	s.retired.closeWhere(lost)
}

func (s *submitter) closeAll() {
	for id, c := range s.conns {
		_ = c.ep.Close()
		delete(s.conns, id)
	}
}

// carry carries out what x's SubmitCore decides from x.effs on: it
// connects, posts and disconnects, and fills x.res, the answer to the
// chunk, and x.failure, what the submitter must panic with after
// answering, for its supervisor to act on.
func (s *submitter) carry(x *served) {
	w := x.w
	dest := &w.Job.Plan.Dests[w.Dest]
	effs := x.effs
	for i := 0; i < len(effs); i++ {
		switch e := effs[i].(type) {
		case Disconnect:
			s.disconnect(e.Peer)
		case PostBatch: // always the last effect: go on with what its end brings
			effs, i = x.core.Step(s.post(w, dest, &x.rec, x.res)), -1
		case AnswerWork:
			x.res.Err = e.Err
			if e.Outcome == WorkPosted {
				x.res.Posted, x.res.Bytes, x.res.Blocks = true, x.rec.Bytes, x.rec.Blocks
			}
		case Restart:
			x.failure = endpointFailure{peer: e.Peer, err: e.Cause}
		case Escalate:
			x.failure = deviceFailure{err: e.Cause}
		}
	}
	x.effs = nil
}

// post connects to the destination (on first use), builds the Work's
// writes and posts them as one batch through the chunk's gate.
func (s *submitter) post(w *Work, dest *plan.Dest, rec *Batch, res *messages.Submitted) *PostEnded {
	if w.Job.Context().Err() != nil {
		// The chunk ended (its gate is closed: nothing would be posted):
		// connect to nothing, since its peer may have been forgotten.
		return &PostEnded{}
	}
	c, err := s.conn(dest.Peer)
	if err != nil {
		if w.Job.Context().Err() != nil {
			// It ended meanwhile (its timeout), and its peer may have been
			// removed since: nothing to post, and no restart for it.
			return &PostEnded{}
		}
		return &PostEnded{ConnErr: err}
	}
	s.build(w.Buffers, dest, c)
	rec.Bytes, rec.Blocks, rec.Posted = bytesOf(s.writes), len(s.writes), time.Now()
	replyTo, root, obs, b, try := w.ReplyTo, s.env.System.Root, s.env.Observer, *rec, w.Try
	held := &heldBytes{n: int64(rec.Bytes), in: &s.env.InFlight}
	done := func(err error) {
		held.release()
		c.completed()
		b := b // the closure is per batch; each call completes a copy
		b.Done, b.Err = time.Now(), err
		obs.Batch(b)
		root.Send(replyTo, &messages.BatchDone{Seq: b.Seq, Dest: b.Dest, Err: err, At: b.Done, Broken: BrokenEndpoint(err), Try: try})
	}
	c.inflight.Add(1)
	s.env.InFlight.Add(held.n)
	posted, err := w.Job.post(w.Seq, w.Dest, c.ep, s.writes, held, done)
	res.PostedAt = rec.Posted
	if !posted {
		c.inflight.Add(-1) // done will never run
		held.release()
	}
	return &PostEnded{Posted: posted, Err: err, Writes: len(s.writes)}
}

// build turns the runs into the writes of the buffers toward dest, reusing
// the submitter's slices so that steady-state submits allocate nothing.
func (s *submitter) build(buffers []int, dest *plan.Dest, c *conn) {
	s.blocks, s.writes = buildWrites(s.blocks, s.writes[:0], s.env.Layout, buffers, dest, c.bases, c.keys)
}

// buildWrites appends to ws the writes of buffers toward dest, whose peer's
// buffers start at bases and import as keys, and returns the scratch block
// slice and ws for reuse. Without a route buffer b goes to the peer's buffer
// b, one write per run (cp.AppendBlocks); with one, to the peer's buffer
// Route.DstBuffers[b] (none if -1), as the route's pieces
// (reshard.Route.AppendBlocks). Neither allocates once the slices grew.
func buildWrites(blocks []cp.Block, ws []rdma.Write, l *plan.Layout, buffers []int, dest *plan.Dest, bases []uint64, keys []rdma.RemoteKey) ([]cp.Block, []rdma.Write) {
	r := dest.Route
	for _, b := range buffers {
		buf := &l.Buffers[b]
		d := b
		if r == nil {
			blocks = cp.AppendBlocks(blocks[:0], dest.Runs, buf.Base, bases[d], buf.ItemLen)
		} else {
			if d = r.DstBuffers[b]; d < 0 {
				continue
			}
			blocks = r.AppendBlocks(blocks[:0], dest.Runs, buf.Base, bases[d])
		}
		for _, blk := range blocks {
			ws = append(ws, rdma.Write{Src: blk.Src, Dst: blk.Dst, Len: blk.Len, Local: l.Keys[b], Remote: keys[d]})
		}
	}
	return blocks, ws
}

func bytesOf(ws []rdma.Write) uint64 {
	var n uint64
	for _, w := range ws {
		n += w.Len
	}
	return n
}

// conn returns the endpoint to a peer, connecting and importing its buffers
// on first use.
func (s *submitter) conn(peerID string) (*conn, error) {
	peer, ok := s.env.Peers.Get(peerID)
	if c, had := s.conns[peerID]; had {
		if ok && c.rec == peer {
			return c, nil
		}
		// The peer was removed (and maybe added again, a decode server
		// that restarted) before this submitter heard: its endpoint and
		// keys are the old record's.
		s.disconnect(peerID)
	}
	if !ok {
		return nil, errors.Mark(errors.Newf("unknown peer %q", peerID), rdma.ErrEndpointBroken)
	}
	ep, err := s.env.Transport.Connect(peer.Address)
	if err != nil {
		return nil, errors.Wrapf(err, "connect to peer %q", peerID)
	}
	c := &conn{peer: peerID, rec: peer, ep: ep, keys: make([]rdma.RemoteKey, len(peer.Buffers)), bases: make([]uint64, len(peer.Buffers))}
	for i, b := range peer.Buffers {
		if c.keys[i], err = ep.Import(b.Region); err != nil {
			_ = ep.Close()
			return nil, errors.Mark(errors.Wrapf(err, "import buffer %d of peer %q", i, peerID), rdma.ErrEndpointBroken)
		}
		c.bases[i] = b.Region.Addr
	}
	s.conns[peerID] = c
	return c, nil
}
