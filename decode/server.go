package decode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode/internal/core"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/stderrs"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/netsec"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
)

// ServerActor is the name of a Server's actor on its Node. A node hosts
// one Server by that name; Servers that share a node (the decode ranks of
// one process) each have a Config.Name, and their actor is
// ServerActor-Name.
const ServerActor = "kvstream-decode"

// maxServerName bounds Config.Name and DialConfig.Server.
const maxServerName = 64

// serverActor is the actor name of the Server called name on its node, or
// an error marked ErrBadInput when name cannot be one: it becomes part of
// an actor's address, so it is kept to a short run of [A-Za-z0-9._-].
func serverActor(field, name string) (string, error) {
	if name == "" {
		return ServerActor, nil
	}
	if len(name) > maxServerName {
		return "", badInput("%s %.64q: longer than %d bytes", field, name, maxServerName)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return "", badInput("%s %q: want letters, digits, '.', '_' or '-'", field, name)
		}
	}
	return ServerActor + "-" + name, nil
}

// Defaults.
const (
	DefaultID                 = "decode"
	DefaultMaxSessions        = 64
	DefaultMaxRoomsPerSession = 4096
	DefaultMaxChunksPerRoom   = 8192
	DefaultByeGrace           = 10 * time.Second
	DefaultRevokeTimeout      = 10 * time.Second
	// DefaultMaxPoolBytes bounds a pool sized by Config.Size: 64 GiB.
	DefaultMaxPoolBytes = 64 << 30
)

// The largest Config.MaxSessions, MaxRoomsPerSession and MaxChunksPerRoom
// New takes: a server's trace records them, and a trace holding more does
// not replay (trace.MaxDecodeSessions, MaxDecodeRooms, MaxDecodeChunks).
// Real bounds are tens to thousands.
const (
	MaxSessionsLimit        = trace.MaxDecodeSessions
	MaxRoomsPerSessionLimit = trace.MaxDecodeRooms
	MaxChunksPerRoomLimit   = trace.MaxDecodeChunks
)

// ProtocolVersion is the control protocol version this package speaks
// (messages/wire: Hello.version, Offer.version).
const ProtocolVersion = core.ProtocolVersion

// The bounds the core holds a Hello to, which the calls of this package
// check too.
const (
	maxBuffers  = core.MaxBuffers
	maxPageSize = core.MaxPageSize
	maxNameLen  = core.MaxNameLen
)

// Server is the decode side of kvstream: it owns the registration of the
// decode pool with the transport, answers prefill sessions on its Node, and
// tells the serving stack per room when the KV landed (Wait) or why it
// will not.
//
// It is a shell around the decode core (package decode/internal/core,
// which decides and does no I/O): one actor delivers every message (from
// the network, from the heartbeats, timers and revocations, and the
// serving stack's calls) to the core, one at a time, and performs the
// effects the core returns. No lock guards the core: only the actor
// touches it.
type Server struct {
	node *Node
	tr   rdma.Transport
	cfg  Config
	log  *zap.Logger
	pid  *actor.PID
	key  string // node address / actor name, set before the actor starts (pid is not)
	obs  Observer

	// Owned by the actor.
	core     *core.Core
	bufs     []Buffer
	regions  []rdma.Region // the pool's, one per buffer
	owned    []bool        // regions this server registered (and deregisters)
	sized    bool          // the pool came from Config.Size
	access   map[string]rdma.PeerAccess
	sessions map[string]*Session
	waiters  map[uint64][]waiter // by room id
	timers   map[uint64]*time.Timer
	reply    chan core.Reply // the call being answered
	ctx      actor.Context
	// byes are the senders of goodbyes whose answers the core holds until
	// their sessions' access is revoked (AnswerBye.Reply names them).
	byes    map[string]*actor.PID
	nextBye uint64
	// cancels are the Server.Cancel calls waiting for their room's
	// CancelSettled, by room instance (core.Reply.Instance: a room id
	// Expected again is another room); settledNow holds the settlements
	// of the step a Cancel is driving, which no waiter is registered for
	// yet.
	cancels    map[uint64][]chan bool
	settledNow map[uint64]bool
	// cancelStarts are when the Server.Cancel calls began, by the
	// instance of the room each cancelled, until it settles: its
	// settlement is observed then (CancelObserver), whether or not the
	// call still waits.
	cancelStarts map[uint64]time.Time

	// The message trace, when recording (trace.go): nil otherwise.
	rec       *trace.Recorder
	traceID   string    // the records' id: the actor's name
	traceTo   io.Writer // written at Close
	traceFile *os.File  // opened for TracePath or EnvTrace, closed at Close

	drained chan struct{} // closed when draining or closed and no session is left
	stopped chan struct{} // closed when the actor stopped

	acceptMu sync.Mutex
	accepted []*Session    // said Hello, not yet Accepted (keepAccepted bounds the ended ones)
	acceptCh chan struct{} // closed and replaced when a session arrives
	closed   bool          // no more Accept
	// maxUnaccepted is MaxUnaccepted (a test lowers it).
	maxUnaccepted int
}

type waitResult struct {
	room Room
	err  error
}

// waiter is a Wait on one room: the instance its Lookup found, since a
// room released before its end was published may end after its id was
// Expected again, and its end is not the newer room's.
type waiter struct {
	instance uint64
	ch       chan waitResult
}

// call is a request of this process to the actor.
type call struct {
	msg   core.Msg
	reply chan core.Reply
}

// run asks the actor to run f (state it owns, read from outside). done is
// closed once f ran, or was skipped: a caller that gave up first (its
// ctx ended) takes state (runAbandoned), and the actor then skips f, so
// that nothing f would change changes after its caller returned.
type run struct {
	f     func()
	done  chan struct{}
	state *atomic.Int32 // nil: f runs whatever its caller does
}

// The states of a run: the actor takes it to run f, or its caller to
// abandon it, whichever comes first.
const (
	runPending int32 = iota
	runTaken
	runAbandoned
)

// stopServer stops the server's actor once it handled what reached it
// before (Close): a system stop would skip a call still queued behind a
// slow Config callback, its CloseMsg included.
type stopServer struct{}

// New registers the pool's buffers with tr and serves prefill sessions on
// node. Close it before the node, and before freeing the pool.
func New(node *Node, tr rdma.Transport, cfg Config) (_ *Server, err error) {
	defer func() { err = public(err) }()
	switch {
	case node == nil || tr == nil:
		return nil, badInput("decode.New needs a node and a transport")
	case node.isClosed():
		return nil, closedError("decode.New on a closed node")
	case len(cfg.Buffers) == 0 && cfg.Size == nil:
		return nil, badInput("decode.New: Config has neither Buffers nor Size")
	case cfg.MaxSessions < 0:
		return nil, badInput("MaxSessions %d: must not be negative", cfg.MaxSessions)
	case cfg.MaxSessions > MaxSessionsLimit:
		return nil, badInput("MaxSessions %d: want 0 (the default, %d) to %d", cfg.MaxSessions, DefaultMaxSessions, MaxSessionsLimit)
	case cfg.MaxRoomsPerSession < 0:
		return nil, badInput("MaxRoomsPerSession %d: must not be negative", cfg.MaxRoomsPerSession)
	case cfg.MaxRoomsPerSession > MaxRoomsPerSessionLimit:
		return nil, badInput("MaxRoomsPerSession %d: want 0 (the default, %d) to %d", cfg.MaxRoomsPerSession, DefaultMaxRoomsPerSession, MaxRoomsPerSessionLimit)
	case cfg.MaxChunksPerRoom < 0:
		return nil, badInput("MaxChunksPerRoom %d: must not be negative", cfg.MaxChunksPerRoom)
	case cfg.MaxChunksPerRoom > MaxChunksPerRoomLimit:
		return nil, badInput("MaxChunksPerRoom %d: want 0 (the default, %d) to %d", cfg.MaxChunksPerRoom, DefaultMaxChunksPerRoom, MaxChunksPerRoomLimit)
	case cfg.ByeGrace < 0:
		return nil, badInput("ByeGrace %v: must not be negative", cfg.ByeGrace)
	case cfg.DepartedGrace < 0:
		return nil, badInput("DepartedGrace %v: must not be negative", cfg.DepartedGrace)
	case cfg.RoomTimeout < 0:
		return nil, badInput("RoomTimeout %v: must not be negative", cfg.RoomTimeout)
	case cfg.RevokeTimeout < 0:
		return nil, badInput("RevokeTimeout %v: must not be negative", cfg.RevokeTimeout)
	case cfg.PageSize < 0 || cfg.PageSize > maxPageSize:
		return nil, badInput("PageSize %d: want 0 (the first session's) to %d", cfg.PageSize, maxPageSize)
	}
	if cfg.Group != nil {
		if err := core.CheckGroup(*cfg.Group); err != nil {
			return nil, err
		}
		if cfg.PageSize != 0 && cfg.PageSize != cfg.Group.PageSize {
			return nil, badInput("PageSize %d, Group.PageSize %d: they must agree", cfg.PageSize, cfg.Group.PageSize)
		}
	}
	name, err := serverActor("Config.Name", cfg.Name)
	if err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		cfg.ID = DefaultID
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.MaxRoomsPerSession == 0 {
		cfg.MaxRoomsPerSession = DefaultMaxRoomsPerSession
	}
	if cfg.MaxChunksPerRoom == 0 {
		cfg.MaxChunksPerRoom = DefaultMaxChunksPerRoom
	}
	if cfg.ByeGrace == 0 {
		cfg.ByeGrace = DefaultByeGrace
	}
	if cfg.RevokeTimeout == 0 {
		cfg.RevokeTimeout = DefaultRevokeTimeout
	}
	if cfg.MaxPoolBytes == 0 {
		cfg.MaxPoolBytes = DefaultMaxPoolBytes
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{node: node, tr: tr, cfg: cfg, log: log, obs: cfg.Observer, key: node.Addr() + "/" + name, access: map[string]rdma.PeerAccess{},
		sessions: map[string]*Session{}, waiters: map[uint64][]waiter{}, timers: map[uint64]*time.Timer{}, byes: map[string]*actor.PID{}, cancels: map[uint64][]chan bool{}, cancelStarts: map[uint64]time.Time{}, drained: make(chan struct{}),
		stopped: make(chan struct{}), acceptCh: make(chan struct{}), maxUnaccepted: MaxUnaccepted}
	if s.obs == nil {
		s.obs = nopObserver{}
	}
	var pool []Buffer
	if len(cfg.Buffers) > 0 {
		if err := s.register(cfg.Buffers); err != nil {
			return nil, err
		}
		pool = cfg.Buffers
	}
	group := cfg.Group
	if group != nil {
		g := *group
		group = &g
	}
	rules := core.Rules{MaxSessions: cfg.MaxSessions, MaxRoomsPerSession: cfg.MaxRoomsPerSession, MaxChunksPerRoom: cfg.MaxChunksPerRoom,
		Prefills: slices.Clone(cfg.Prefills), TLS: node.tls, Group: group, PageSize: cfg.PageSize, RoomTimeout: cfg.RoomTimeout, ByeGrace: cfg.ByeGrace,
		AcceptUnknownRooms: cfg.AcceptUnknownRooms, Admit: cfg.Admit != nil, Verify: cfg.Verify != nil,
		Size: len(cfg.Buffers) == 0, MaxPoolBytes: cfg.MaxPoolBytes}
	s.core = core.NewCore(rules, pool)
	if err := s.startTrace(cfg, name, rules, pool, os.Getenv); err != nil {
		s.deregister()
		return nil, err
	}
	// Open: a Hello from any authenticated peer reaches the core, which
	// answers it, a refusal included.
	node.policy.Open(name)
	props := actor.PropsFromFunc(s.receive, actor.WithReceiverMiddleware(recoverMiddleware(log.With(zap.String("server", s.key)))))
	if s.pid, err = node.system.Root.SpawnNamed(props, name); err != nil {
		s.deregister()
		s.dropTrace()
		return nil, errors.Wrapf(err, "spawn %s on node %s (Servers that share a node need distinct Config.Names)", name, node.Addr())
	}
	return s, nil
}

// register validates the pool and registers it. On error nothing stays
// registered.
func (s *Server) register(bufs []Buffer) error {
	if err := core.CheckPool(bufs); err != nil {
		return errors.Mark(err, ErrBadInput)
	}
	var regions []rdma.Region
	var owned []bool
	for i, b := range bufs {
		var err error
		size := b.ItemLen * uint64(b.Pages)
		switch {
		case b.Base == 0:
			err = badInput("decode buffer %d (%s): nil base address", i, b.Name)
		case b.Region != nil && (b.Region.Desc().Addr != b.Base || b.Region.Desc().Len < size):
			d := b.Region.Desc()
			err = badInput("decode buffer %d (%s): its region [%#x, +%d) does not hold [%#x, +%d)", i, b.Name, d.Addr, d.Len, b.Base, size)
		}
		r := b.Region
		if err == nil && r == nil {
			r, err = rdma.RegisterMemory(s.tr, b.Base, size, b.Memory)
		}
		if err != nil {
			for j, r := range regions {
				if owned[j] {
					_ = r.Deregister()
				}
			}
			return errors.Wrapf(err, "register decode buffer %d (%s)", i, b.Name)
		}
		regions = append(regions, r)
		owned = append(owned, b.Region == nil)
	}
	s.bufs, s.regions, s.owned = slices.Clone(bufs), regions, owned
	return nil
}

func (s *Server) deregister() {
	for i, r := range s.regions {
		if s.owned[i] {
			_ = r.Deregister()
		}
	}
	s.regions, s.bufs, s.owned = nil, nil, nil
}

// recoverMiddleware keeps a panic in a handler (a bug, or a Config
// callback's) from losing the message silently: it is logged, and the
// actor goes on.
func recoverMiddleware(log *zap.Logger) actor.ReceiverMiddleware {
	return func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			defer func() {
				if p := recover(); p != nil {
					log.Error("decode server: handler panicked", zap.String("message", fmt.Sprintf("%T", env.Message)), zap.Any("panic", p))
				}
			}()
			next(c, env)
		}
	}
}

// receive is the server's actor.
func (s *Server) receive(ctx actor.Context) {
	s.ctx = ctx
	defer func() { s.ctx = nil }()
	switch m := ctx.Message().(type) {
	case *wire.Hello:
		s.drive(core.HelloMsg{From: origin(ctx), Hello: m, Token: newToken()})
	case *wire.ChunkNotice:
		s.drive(core.NoticeMsg{From: origin(ctx), Notice: m})
	case *wire.Cancel:
		s.drive(core.CancelMsg{From: origin(ctx), Cancel: m})
	case *wire.Bye:
		s.nextBye++
		id := fmt.Sprint(s.nextBye)
		s.byes[id] = ctx.Sender()
		s.drive(core.ByeMsg{From: origin(ctx), Bye: m, Reply: id})
	case *actor.Terminated:
		if m.Who != nil {
			s.drive(core.DepartedMsg{Actor: m.Who.Address + "/" + m.Who.Id, Grace: s.departedGrace()})
		}
	case core.TimerMsg:
		delete(s.timers, m.ID)
		s.drive(m)
	case core.PeerLostMsg, core.RevokedMsg:
		s.drive(m.(core.Msg))
	case call:
		s.reply = m.reply
		s.drive(m.msg)
		s.reply = nil
	case run:
		func() {
			defer close(m.done) // also when f panics: its caller does not wait for ever
			if m.state == nil || m.state.CompareAndSwap(runPending, runTaken) {
				m.f()
			}
		}()
	case stopServer:
		// Timers pending would only send to a stopped actor.
		for id, t := range s.timers {
			t.Stop()
			delete(s.timers, id)
		}
		ctx.Stop(ctx.Self())
	case *actor.Stopped:
		close(s.stopped)
	}
	if so, ok := s.obs.(StateObserver); ok && s.core != nil {
		so.ServerState(s.key, s.core.State())
	}
}

// departedGrace is how long a session whose actor was reported gone (a
// Terminated), and that says nothing since, stays open before it ends as
// lost (core.DepartedMsg.Grace): Config.DepartedGrace, 0 (never) unless
// set.
func (s *Server) departedGrace() time.Duration { return s.cfg.DepartedGrace }

// origin is who sent the message being handled.
func origin(ctx actor.Context) core.Origin {
	o := core.Origin{Peer: netsec.PeerName(ctx)}
	if sender := ctx.Sender(); sender != nil {
		o.Node = sender.Address
	}
	return o
}

// drive steps the core and performs its effects; a Call's result is
// stepped in at once.
func (s *Server) drive(m core.Msg) {
	for _, e := range s.step(m) {
		if next := s.perform(e); next != nil {
			s.drive(next)
		}
	}
}

// perform does one effect; for a Call it returns the result to step.
func (s *Server) perform(e core.Effect) core.Msg {
	switch e := e.(type) {
	case core.AnswerHello:
		s.answerHello(e)
	case core.AnswerNotice:
		if e.Reason != "" {
			s.obs.Refused("notice", e.Reason)
		}
		s.ctx.Respond(&wire.NoticeAck{Code: e.Code, Error: wireText(e.Text)})
	case core.AnswerBye:
		if e.Summary.Code == wire.Code_REFUSED || e.Summary.Code == wire.Code_BAD_INPUT {
			s.obs.Refused("bye", "not_session")
		}
		// The goodbye's sender, which may not be the message being
		// handled now (the answer waited for a revocation).
		if to := s.byes[e.Reply]; to != nil {
			sum := e.Summary
			if sum != nil && !utf8.ValidString(sum.Error) {
				sum = &wire.Summary{Code: sum.Code, Error: wireText(sum.Error), Chunks: sum.Chunks, Failed: sum.Failed}
			}
			s.ctx.Send(to, sum)
		}
		delete(s.byes, e.Reply)
	case core.Reply:
		if s.reply != nil {
			s.reply <- e
		}
	case core.CallAdmit:
		return core.AdmittedMsg{Err: guard("Config.Admit", func() error { return s.cfg.Admit(e.Prefill, e.Metadata) })}
	case core.CallSize:
		var bufs []Buffer
		err := guard("Config.Size", func() (err error) { bufs, err = s.cfg.Size(e.Layout); return err })
		if err == nil {
			if err = core.CheckPool(bufs); err == nil {
				err = core.MatchLayout(bufs, e.Layout) // before anything is registered
			}
		}
		if err == nil {
			err = s.register(bufs)
		}
		if err == nil {
			s.sized = true
		} else if bufs != nil && s.cfg.Free != nil {
			s.cfg.Free(bufs) // registered nothing: no peer ever saw it
		}
		return core.SizedMsg{Buffers: bufs, Err: err}
	case core.CallOpenAccess:
		pa, ok := s.tr.(rdma.PeerAccessor)
		if !ok {
			return core.AccessMsg{Address: s.tr.Address()}
		}
		a, err := pa.OpenPeerAccess()
		if errors.Is(err, rdma.ErrUnsupported) {
			return core.AccessMsg{Address: s.tr.Address()} // a wrapper of a transport without access points
		}
		if err != nil {
			return core.AccessMsg{Err: err}
		}
		s.access[e.Session] = a
		return core.AccessMsg{Address: a.Address(), Revocable: true}
	case core.CallVerify:
		ss := s.sessions[e.Session]
		return core.VerifiedMsg{Err: guard("Config.Verify", func() error { return s.cfg.Verify(ss, e.Chunk) })}
	case core.SessionOpened:
		s.opened(e.Session)
	case core.Revoke:
		s.revoke(e.Session, e.Lost)
	case core.SessionEnded:
		s.ended(e)
	case core.RoomEnded:
		s.obs.RoomEnded(e.Outcome)
		s.wake(e)
		if f := s.cfg.OnRoomEnd; f != nil {
			go f(e.Room, public(e.Err))
		}
	case core.ArmTimer:
		pid, root := s.pid, s.node.system.Root
		s.timers[e.ID] = time.AfterFunc(e.After, func() { root.Send(pid, core.TimerMsg{ID: e.ID}) })
	case core.ReleasePool:
		bufs := s.bufs
		s.deregister()
		if s.sized && s.cfg.Free != nil {
			s.cfg.Free(bufs)
		}
		s.sized = false
	case core.Verified:
		s.obs.Verified(e.Bytes)
	case core.Quarantined:
		s.obs.Quarantined(e.Pages)
	case core.TellDrain:
		s.tellDrain(e.Session)
	case core.AnswerCancel:
		if e.Reason != "" {
			s.obs.Refused("cancel", e.Reason)
		}
		s.ctx.Respond(&wire.NoticeAck{Code: e.Code, Error: wireText(e.Text)})
	case core.TellCancel:
		if ss := s.sessions[e.Session]; ss != nil {
			if pid := actorPID(ss.info.Actor); pid != nil {
				s.ctx.Request(pid, &wire.Cancel{Session: e.Session, Room: e.Room, Reason: wireText(e.Reason)})
			}
		}
	case core.Cancelled:
		if co, ok := s.obs.(CancelObserver); ok {
			co.Cancelled(e.Direction)
		}
	case core.CancelSettled:
		if s.settledNow != nil {
			s.settledNow[e.Instance] = e.NotQuiesced // the Cancel driving this step observes it
		}
		// Observed when the room settles, whether or not its Cancel still
		// waits (its ctx may have ended): every cancel from the decode
		// side is in the histogram.
		if start, ok := s.cancelStarts[e.Instance]; ok {
			delete(s.cancelStarts, e.Instance)
			s.observeCancel(start)
		}
		for _, w := range s.cancels[e.Instance] {
			w <- e.NotQuiesced
		}
		delete(s.cancels, e.Instance)
	case core.Drained:
		select {
		case <-s.drained:
		default:
			close(s.drained)
		}
	case core.Log:
		s.logEffect(e)
	}
	return nil
}

// wireText is a text a message carries, valid UTF-8 (a byte that is not
// becomes U+FFFD): protobuf refuses to marshal a string field that is not,
// and protoactor then drops the whole message. Texts come from Config
// callbacks (a Verify error quoting the bytes it found) and the serving
// stack's calls.
func wireText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// guard runs a Config callback: a panic in it is that call's error, not
// the server's end.
func guard(what string, f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = errors.Newf("%s panicked: %v", what, p)
		}
	}()
	return f()
}

func (s *Server) answerHello(e core.AnswerHello) {
	offer := &wire.Offer{Version: ProtocolVersion, Code: e.Code, Error: wireText(e.Text)}
	if e.Code != wire.Code_OK {
		s.obs.Refused("hello", e.Reason)
		s.ctx.Respond(offer)
		return
	}
	offer.Session, offer.PeerId, offer.WorkerAddress = e.Session, s.cfg.ID, e.Address
	for i, r := range s.regions {
		d := r.Desc()
		offer.Regions = append(offer.Regions, &wire.Region{Addr: d.Addr, Len: d.Len, Key: d.Key, ItemLen: s.bufs[i].ItemLen})
	}
	s.ctx.Respond(offer)
}

// opened watches a new session: its actor (a Terminated is a suspicion the
// core weighs), its node's heartbeats (the evidence of a loss), and binds
// its peer on the node.
func (s *Server) opened(info core.SessionInfo) {
	ss := &Session{info: info, done: make(chan struct{})}
	ss.report.Prefill = info.Prefill
	s.sessions[info.Token] = ss
	if pid := actorPID(info.Actor); pid != nil {
		s.ctx.Watch(pid)
	}
	if s.node.tls {
		_ = s.node.bind(info.Identity)
	}
	root, pid, token := s.node.system.Root, s.pid, info.Token
	hb, err := s.node.watchPeer(info.Node, "kvstream-decode-hb-"+token[:min(16, len(token))], func(err error) {
		root.Send(pid, core.PeerLostMsg{Session: token, Cause: err})
	})
	if err != nil {
		s.log.Warn("prefill session without heartbeats: a lost prefill is noticed only by its rooms' timeouts",
			zap.String("server", s.key), zap.String("prefill", info.Prefill), zap.String("error", err.Error()))
	}
	ss.heartbeat = hb
	// Lifecycle lines at INFO (never per room or layer): an operator sees
	// who is served without turning DEBUG on.
	s.log.Info("decode session opened", zap.String("server", s.key), zap.String("prefill", info.Prefill),
		zap.String("node", info.Node), zap.Int("rank", info.Rank))
	s.acceptMu.Lock()
	// Close closes acceptCh before its CloseMsg reaches the actor: a
	// session opened in between is ended by that CloseMsg, and no Accept
	// takes it.
	if !s.closed {
		s.accepted = keepAccepted(append(s.accepted, ss), s.maxUnaccepted)
		close(s.acceptCh)
		s.acceptCh = make(chan struct{})
	}
	s.acceptMu.Unlock()
}

// tellDrain tells a session's prefill that this server drains: a message
// to the session actor its Hello named, which checks the token.
func (s *Server) tellDrain(token string) {
	ss := s.sessions[token]
	if ss == nil {
		return
	}
	pid := actorPID(ss.info.Actor)
	if pid == nil {
		return
	}
	s.ctx.Request(pid, &wire.Drain{Session: token, Reason: "the decode server " + s.cfg.ID + " is draining (stopping)"})
	if do, ok := s.obs.(DrainObserver); ok {
		do.DrainTold()
	}
	s.log.Debug("told a prefill session the server drains", zap.String("server", s.key), zap.String("prefill", ss.info.Prefill))
}

// actorPID parses "address/id" (the core's form of a session actor).
func actorPID(s string) *actor.PID {
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return actor.NewPID(s[:i], s[i+1:])
	}
	return nil
}

// revoke cuts a session's peer off the pool, off the actor (a transport
// may drain first), and reports through the mailbox within RevokeTimeout.
// A lost peer (it stopped answering) is cut off without tearing its
// connections down where the transport offers that (rdma.LostPeerRevoker).
func (s *Server) revoke(token string, lost bool) {
	root, pid := s.node.system.Root, s.pid
	a := s.access[token]
	delete(s.access, token)
	if ss := s.sessions[token]; ss != nil && ss.heartbeat != nil {
		hb := ss.heartbeat
		ss.heartbeat = nil
		go hb.stop() // not on the actor: stop waits for the monitor
	}
	if a == nil {
		root.Send(pid, core.RevokedMsg{Session: token, Err: errors.Mark(errors.Newf("the %s transport cannot cut one peer off (no rdma.PeerAccessor)", s.tr.Name()), ErrNotQuiesced)})
		return
	}
	limit := s.cfg.RevokeTimeout
	go func() {
		done := make(chan error, 1)
		go func() {
			if lr, ok := a.(rdma.LostPeerRevoker); ok && lost {
				done <- lr.RevokeLost()
				return
			}
			done <- a.Revoke()
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(limit):
			err = errors.Mark(errors.Newf("revoking the access point took more than %v (Config.RevokeTimeout)", limit), ErrNotQuiesced)
		}
		root.Send(pid, core.RevokedMsg{Session: token, Err: err})
	}()
}

func (s *Server) ended(e core.SessionEnded) {
	s.obs.SessionEnded(e.Outcome)
	ss := s.sessions[e.Session]
	if ss == nil {
		return
	}
	delete(s.sessions, e.Session)
	s.log.Info("decode session ended", zap.String("server", s.key), zap.String("prefill", ss.info.Prefill),
		zap.String("outcome", e.Outcome), zap.Int("open", len(s.sessions)))
	if pid := actorPID(ss.info.Actor); pid != nil && s.ctx != nil {
		s.ctx.Unwatch(pid)
	}
	if s.node.tls {
		s.node.unbind(ss.info.Identity)
	}
	ss.finish(e.Report, public(e.Err))
}

func (s *Server) logEffect(e core.Log) {
	fields := make([]zap.Field, 0, len(e.Fields)/2+1)
	fields = append(fields, zap.String("server", s.key))
	for i := 0; i+1 < len(e.Fields); i += 2 {
		k, _ := e.Fields[i].(string)
		fields = append(fields, zap.Any(k, e.Fields[i+1]))
	}
	if e.Level == core.Warn {
		s.log.Warn(e.Msg, fields...)
	} else {
		s.log.Debug(e.Msg, fields...)
	}
}

// do sends a call to the actor and waits for its reply, within ctx. The
// actor may be busy in a Config callback (a slow Admit, Size or Verify):
// when ctx ends first, the call stays queued and the actor takes it once
// free, its reply (buffered) unread. The calls given a ctx (Close, Drain)
// want that; the others are given context.Background().
func (s *Server) do(ctx context.Context, m core.Msg) (core.Reply, error) {
	reply := make(chan core.Reply, 1)
	s.node.system.Root.Send(s.pid, call{msg: m, reply: reply})
	select {
	case r := <-reply:
		return r, nil
	case <-s.stopped:
		return core.Reply{}, closedError(fmt.Sprintf("%T", m))
	case <-ctx.Done():
		return core.Reply{}, errors.Wrapf(ctx.Err(), "%T: the decode server's actor did not answer (busy in a Config callback?)", m)
	}
}

// inActor runs f on the actor, within ctx: when ctx ends before the actor
// took f (it may be busy in a Config callback), f never runs and the error
// is ctx's; once the actor took it, f runs to its end (it is short) and
// inActor returns nil after it.
func (s *Server) inActor(ctx context.Context, f func()) error {
	done := make(chan struct{})
	state := new(atomic.Int32)
	s.node.system.Root.Send(s.pid, run{f: f, done: done, state: state})
	select {
	case <-done:
		return nil
	case <-s.stopped:
		return closedError("the decode server")
	case <-ctx.Done():
		if state.CompareAndSwap(runPending, runAbandoned) {
			return errors.Wrap(ctx.Err(), "the decode server's actor did not take the call (busy in a Config callback?)")
		}
	}
	// The actor took f first: it is running it.
	select {
	case <-done:
		return nil
	case <-s.stopped:
		return closedError("the decode server")
	}
}

// Peer describes the pool to a prefill engine in this process
// (system.Engine.AddPeer); a prefill in another process gets the same
// through Dial. It is an error while a pool sized by Config.Size is not
// sized.
func (s *Server) Peer() (plan.Peer, error) {
	var p plan.Peer
	var ok bool
	if err := s.inActor(context.Background(), func() {
		if ok = s.regions != nil; ok {
			p = plan.Peer{ID: s.cfg.ID, Address: s.tr.Address()}
			for i, r := range s.regions {
				p.Buffers = append(p.Buffers, plan.PeerBuffer{Region: r.Desc(), ItemLen: s.bufs[i].ItemLen})
			}
		}
	}); err != nil {
		return plan.Peer{}, public(err)
	}
	if !ok {
		return plan.Peer{}, public(badInput("the decode pool is not sized (Config.Size runs at a Hello)"))
	}
	return p, nil
}

// Addr is the address a prefill dials: the node's.
func (s *Server) Addr() string { return s.node.Addr() }

// Expect declares a room before its prefill writes it: pages are the decode
// pages the serving stack allocated for the request, in position order
// (the DecodeInfo.DstPages the prefill registers). Notices for the room are
// checked against them, and any prefill identity may report it (the first
// one to report it keeps it): ExpectFrom names the one. A page outside the
// pool, a duplicate page, a page another room holds, or a room already
// expected and not Released is an error marked ErrBadInput that names the
// value; a page a prefill may still write (a room released in progress, a
// lost prefill) is also marked ErrNotQuiesced. Nothing changes on error.
func (s *Server) Expect(id uint64, pages []int) error {
	return s.ExpectFrom(id, pages, "")
}

// ExpectFrom is Expect for a room that only the prefill of identity
// prefill may report (its certificate name; in the clear, the name its
// Dial gives): notices from any other session are refused, so no other
// holder of a certificate of the deployment can report the room first.
func (s *Server) ExpectFrom(id uint64, pages []int, prefill string) error {
	r, err := s.do(context.Background(), core.ExpectMsg{Room: id, Pages: slices.Clone(pages), From: prefill})
	if err == nil {
		err = r.Err
	}
	return public(err)
}

// Wait returns the room once its last chunk's bytes landed and every chunk
// of it succeeded (Room.Complete), or an error that says why the room must
// not be decoded: ErrChunkFailed (a chunk failed or was refused),
// ErrPrefillLost, ErrSessionAborted, ErrClosed, or ctx's error. Pages of a
// room whose error is marked ErrNotQuiesced may still be written: do not
// reuse them for another room. An unknown room (never Expected, Released,
// or created by a notice and forgotten) is an error marked ErrBadInput.
func (s *Server) Wait(ctx context.Context, id uint64) (Room, error) {
	ch := make(chan waitResult, 1)
	var r core.Reply
	var err error
	// Within ctx: the actor may be busy in a slow Config callback (Admit,
	// Size, Verify). A lookup it did not take before ctx ended never runs,
	// and registers no waiter.
	if ierr := s.inActor(ctx, func() {
		r = s.step(core.LookupMsg{Room: id})[0].(core.Reply)
		if r.Err == nil && !r.Ended {
			s.waiters[id] = append(s.waiters[id], waiter{instance: r.Instance, ch: ch})
		}
	}); ierr != nil {
		return Room{}, public(errors.Wrapf(ierr, "wait for room %d", id))
	}
	switch {
	case r.Ended:
		return r.Room, public(r.Err)
	case r.Err != nil:
		return Room{}, public(r.Err)
	}
	select {
	case w := <-ch:
		return w.room, public(w.err)
	case <-ctx.Done():
		err = errors.Wrapf(ctx.Err(), "wait for room %d", id)
		// No one waits any more: forget the waiter, or a stack polling
		// a room with bounded Waits leaves one per call until it ends.
		// Sent, not waited for: the actor may be running a slow Admit or
		// Size, and Wait returns when its ctx ends.
		s.node.system.Root.Send(s.pid, run{done: make(chan struct{}), f: func() {
			s.keepWaiters(id, func(w waiter) bool { return w.ch != ch })
		}})
	case <-s.stopped:
		err = closedError("Wait")
	}
	return Room{}, public(err)
}

// Release forgets a room: its id may be Expected again. The serving stack
// releases a room once it no longer needs its pages' KV. Releasing a room
// still in progress abandons it (its Wait fails): its pages stay out of
// new rooms until its prefill reported its last chunk or a failure that
// stopped its writes, or its session ended with its access revoked. An
// unknown room is an error marked ErrBadInput.
func (s *Server) Release(id uint64) error {
	r, err := s.do(context.Background(), core.ReleaseMsg{Room: id})
	if err == nil {
		err = r.Err
	}
	return public(err)
}

// Disconnect cuts the prefill of identity off as if it were lost: its
// sessions end, every room that still needed them fails (ErrPrefillLost),
// and its access to the pool is revoked; a page it may still write is
// kept out of new rooms until that is confirmed (for good when it cannot
// be). An operator evicts a misbehaving prefill with it. No session of
// that identity is an error marked ErrBadInput.
func (s *Server) Disconnect(identity string, why error) error {
	r, err := s.do(context.Background(), core.DisconnectMsg{Identity: identity, Cause: why})
	if err == nil {
		err = r.Err
	}
	return public(err)
}

// State is what the server holds now (sessions, rooms, the pool): for
// readiness checks and logs.
func (s *Server) State() (State, error) {
	r, err := s.do(context.Background(), core.StateMsg{})
	return r.State, public(err)
}

// Cancel gives a room up on the decode side (the scheduler's timeout, an
// eviction, its client gone): the room fails (its Wait: ErrCancelled) and
// is released, and every prefill session that may write it is told
// (wire.Cancel): its client drops the room in its engine (as
// system.Engine.Drop: no further group of it is posted) and answers once
// no write of it can land. Cancel returns then, with the room's pages back
// in the pool: within one group's transfer and a round trip of the call,
// at once when no prefill may write the room. why is said to the prefill.
//
// A room has one outcome: one that completed or failed first is an error
// marked ErrBadInput naming its outcome, and nothing changes; one the
// prefill cancelled first is released; a second Cancel is an error marked
// ErrBadInput. An unknown room too. When ctx ends first the room stays
// cancelled and its pages come back when the prefill answers or its access
// is revoked: the error is ctx's, also marked ErrNotQuiesced. When ctx
// ends before the server took the cancel at all (its actor busy in a slow
// Config callback), nothing changed: the error is ctx's, not marked
// ErrNotQuiesced. A prefill whose writes could not be stopped keeps the
// pages out for good: the error is marked ErrNotQuiesced.
func (s *Server) Cancel(ctx context.Context, id uint64, why string) error {
	why = core.Clip(why, 1024)
	start := time.Now()
	settled := make(chan bool, 1)
	var r core.Reply
	// Within ctx: a cancel the actor did not take before ctx ended (busy
	// in a slow Config callback) never runs.
	if err := s.inActor(ctx, func() {
		// The room may settle in the step itself, before its instance is
		// known here: settledNow catches that.
		s.settledNow = map[uint64]bool{}
		reply := make(chan core.Reply, 1)
		s.reply = reply
		s.drive(core.CancelRoomMsg{Room: id, Cause: why})
		s.reply = nil
		r = <-reply
		now := s.settledNow
		s.settledNow = nil
		if r.Err != nil {
			return
		}
		if nq, ok := now[r.Instance]; ok {
			s.observeCancel(start)
			settled <- nq
			return
		}
		s.cancels[r.Instance] = append(s.cancels[r.Instance], settled)
		s.cancelStarts[r.Instance] = start
	}); err != nil {
		if errors.Is(err, ErrClosed) {
			return public(err)
		}
		return public(errors.Wrapf(err, "cancel room %d: not cancelled, nothing changed", id))
	}
	if r.Err != nil {
		return public(r.Err)
	}
	select {
	case notQuiesced := <-settled:
		if notQuiesced {
			return public(errors.Mark(errors.Newf("room %d cancelled, but a prefill that may still write it could not be cut off: its pages are kept out for good", id), ErrNotQuiesced))
		}
		return nil
	case <-ctx.Done():
		// No one waits any more: forget the waiter (the room may never
		// settle, its pages in quarantine). Sent, not waited for: the
		// actor may be running a slow Config callback, and Cancel returns
		// when its ctx ends. (settled is buffered: a settlement before
		// this runs blocks nothing.)
		s.node.system.Root.Send(s.pid, run{done: make(chan struct{}), f: func() {
			ws := s.cancels[r.Instance]
			if i := slices.Index(ws, settled); i >= 0 {
				ws = slices.Delete(ws, i, i+1)
			}
			if len(ws) == 0 {
				delete(s.cancels, r.Instance)
			} else {
				s.cancels[r.Instance] = ws
			}
		}})
		return public(errors.Mark(errors.Wrapf(ctx.Err(), "cancel room %d: cancelled, its pages not yet quiet", id), ErrNotQuiesced))
	case <-s.stopped:
		return public(closedError("Cancel"))
	}
}

// observeCancel counts a Server.Cancel begun at start whose room settled
// (CancelObserver).
func (s *Server) observeCancel(start time.Time) {
	if co, ok := s.obs.(CancelObserver); ok {
		co.CancelSettled(time.Since(start))
	}
}

// MaxUnaccepted bounds the sessions that ended and that Accept has not
// returned which a Server keeps: past it, the oldest of them are dropped.
// A session still open is never dropped (Config.MaxSessions bounds those
// open, Config.RevokeTimeout how long an ending one waits for its
// revocation), so a server nobody Accepts from keeps at most this many
// sessions besides its live ones, and what they hold (their reports).
const MaxUnaccepted = 1024

// Accept returns the next prefill session that said Hello, in the order
// they said it (sessions are served whether or not anyone accepts them;
// Accept is how the serving stack learns of them, to log them or to wait
// for their end). A session that ended before Accept took it may be gone:
// once more than MaxUnaccepted sessions wait to be accepted, the oldest
// that ended are dropped, so a stack that never calls Accept does not
// keep every session for the server's life. Every session still open
// is returned. It returns within ctx.
func (s *Server) Accept(ctx context.Context) (*Session, error) {
	for {
		s.acceptMu.Lock()
		if len(s.accepted) > 0 {
			ss := s.accepted[0]
			s.accepted[0] = nil // the array does not keep it
			s.accepted = s.accepted[1:]
			s.acceptMu.Unlock()
			return ss, nil
		}
		if s.closed {
			s.acceptMu.Unlock()
			return nil, public(closedError("Accept"))
		}
		ch := s.acceptCh
		s.acceptMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, public(errors.Wrap(ctx.Err(), "accept a prefill session"))
		}
	}
}

// keepAccepted drops the oldest sessions of list that ended until it holds
// at most max, keeping the order; sessions still open all stay, however
// many. The slots it empties are cleared: the array does not keep what it
// dropped.
func keepAccepted(list []*Session, max int) []*Session {
	excess := len(list) - max
	if excess <= 0 {
		return list
	}
	out := list[:0]
	for _, ss := range list {
		if excess > 0 && ss.ended() {
			excess--
			continue
		}
		out = append(out, ss)
	}
	clear(list[len(out):])
	return out
}

// Drain stops taking sessions (a Hello is answered ErrUnavailable) and
// returns once every open session ended, or when ctx ends. Rooms in flight
// go on; the serving stack Waits for them as before.
func (s *Server) Drain(ctx context.Context) error {
	// Within ctx: the actor may be busy in a slow Config callback; the
	// drain it takes once free all the same.
	if _, err := s.do(ctx, core.DrainMsg{}); err != nil {
		if errors.Is(err, ErrClosed) {
			return public(err)
		}
		return public(errors.Wrap(err, "drain the decode server"))
	}
	s.log.Info("decode server draining: no new session", zap.String("server", s.key))
	select {
	case <-s.drained:
		s.log.Info("decode server drained: no session left", zap.String("server", s.key))
		return nil
	case <-ctx.Done():
		s.log.Warn("decode server drain cut: sessions still open", zap.String("server", s.key), stderrs.WarnField(ctx.Err()))
		return public(errors.Wrap(ctx.Err(), "drain the decode server"))
	}
}

// Close ends every session and room (ErrClosed), cuts every prefill off
// the pool and deregisters it, and stops the server's actor; it does not
// stop the node. It returns within ctx. When a prefill's access could not
// be confirmed revoked, the pool stays registered and Close's error is
// marked ErrNotQuiesced: keep the pool's memory mapped (a peer may still
// write it) until the transport is closed. When ctx ends while the
// server's actor runs a slow Config callback (Admit, Size, Verify), the
// error is ctx's, marked ErrNotQuiesced: the actor ends the sessions and
// rooms, and stops, once the callback returned. A second Close returns nil.
func (s *Server) Close(ctx context.Context) error {
	s.acceptMu.Lock()
	if s.closed {
		s.acceptMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.acceptCh)
	s.acceptMu.Unlock()
	// Every wait below is within ctx: the actor may be busy in a slow
	// Config callback (Admit, Size, Verify). What Close asked of it then
	// stays queued, in order: the actor ends the sessions and rooms
	// (CloseMsg), then stops (stopServer), once free.
	busy := func(derr error, what string) error {
		if errors.Is(derr, ErrClosed) {
			return derr
		}
		return errors.Mark(errors.Wrap(derr, "close the decode server: "+what), ErrNotQuiesced)
	}
	var err error
	if _, derr := s.do(ctx, core.CloseMsg{}); derr != nil {
		err = busy(derr, "prefill sessions not yet cut off")
	}
	if err == nil {
		select {
		case <-s.drained:
		case <-ctx.Done():
			err = errors.Mark(errors.Wrap(ctx.Err(), "close the decode server: prefill sessions still being cut off"), ErrNotQuiesced)
		}
	}
	var st State
	if err == nil {
		r, derr := s.do(ctx, core.StateMsg{})
		if st = r.State; derr != nil {
			err = busy(derr, "whether every prefill's access was confirmed revoked is not known yet")
		}
	}
	if err == nil && st.Pooled {
		err = errors.Mark(errors.Newf("the decode pool stays registered: a prefill's access to it could not be confirmed revoked (%d pages kept out of rooms); keep its memory mapped until the transport is closed", st.Quarantined), ErrNotQuiesced)
	}
	// A message, not a system stop, which would come before what is still
	// queued (the CloseMsg behind a slow callback).
	s.node.system.Root.Send(s.pid, stopServer{})
	select {
	case <-s.stopped:
	case <-ctx.Done():
		if err == nil {
			err = errors.Wrapf(ctx.Err(), "stop actor %s", s.pid.Id)
		}
	}
	// Once the actor stopped: every message it took is in the trace.
	if terr := s.closeTrace(); terr != nil && err == nil {
		err = terr
	}
	return public(err)
}

// newToken names a session; the prefill's later messages carry it.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// wake answers the Waits on the room that ended, and keeps those on a
// newer room of its id.
func (s *Server) wake(e core.RoomEnded) {
	s.keepWaiters(e.Room.ID, func(w waiter) bool {
		if w.instance != e.Instance {
			return true
		}
		w.ch <- waitResult{room: e.Room, err: e.Err} // buffered: one answer per Wait
		return false
	})
}

// keepWaiters keeps the Waits on room id that keep says to, and forgets
// the id when none is left.
func (s *Server) keepWaiters(id uint64, keep func(waiter) bool) {
	ws := slices.DeleteFunc(s.waiters[id], func(w waiter) bool { return !keep(w) })
	if len(ws) == 0 {
		delete(s.waiters, id)
	} else {
		s.waiters[id] = ws
	}
}
