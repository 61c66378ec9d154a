package decode

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode/internal/core"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/netsec"
	"github.com/kvstream/kvstream/plan"
	"go.uber.org/zap"
)

// DefaultDecodeName is the certificate name a prefill expects of its decode
// server by default.
const DefaultDecodeName = "decode"

// DefaultCallTimeout bounds one control-plane round trip when the caller's
// context has no earlier deadline.
const DefaultCallTimeout = 10 * time.Second

// DialConfig says which decode server a prefill opens a session with, and
// what it describes to it.
type DialConfig struct {
	// Decode is the decode server's node address (its Server.Addr).
	Decode string
	// Server names the decode server on that node when several share it
	// (its Config.Name); empty: the node's only Server.
	Server string
	// Buffers is the prefill layout: the engine's system.Config.Buffers.
	// Names, layers and item lengths cross the wire; the decode server
	// checks its pool against them. A session whose engines reshard (they
	// add the peer with a system.Peer.Sharding) describes the pool it
	// writes instead: the decode rank's PP stage buffers at the decode
	// side's item length, the pairing itself in Metadata for the server's
	// Config.Admit.
	Buffers []plan.Buffer
	// PageSize is the engine's page size in tokens (system.Config.PageSize),
	// which the decode pool must share: the decode server maps each
	// chunk's tokens to its pages with it. Required.
	PageSize int
	// CP is the engine's context parallelism (system.Config.CP): NoticeFor
	// reports this rank's pages, and a rank of a group of more than one
	// says so in its Hello (Metadata[RankKey]).
	CP cp.CP
	// Name names this prefill in the decode server's logs (default: the
	// node's address).
	Name string
	// DecodeName is the name the decode server's certificate must carry
	// when the node runs TLS (default DefaultDecodeName, the name
	// netsec.GenerateDevCerts gives it): the session is bound to it before
	// Hello, so that no other node of the deployment can speak for it.
	DecodeName string
	// Metadata is passed to the decode side as is (Session.Metadata).
	Metadata map[string]string
	// CallTimeout bounds each round trip (default DefaultCallTimeout).
	CallTimeout time.Duration
	// ConnectTimeout, if positive, is how long Dial keeps trying a decode
	// server that is unreachable (not up yet) or unavailable (draining, at
	// its session bound, this prefill's previous session not yet ended),
	// with a backoff from 100 ms to 2 s. Zero: one attempt.
	ConnectTimeout time.Duration
	// Log receives failures at WARN (default: none).
	Log *zap.Logger
}

// Client is the prefill side of a session with a decode server: the Peer to
// add to the engine, the chunk notices after each Finish, the goodbye, and
// the decode server's loss.
type Client struct {
	node    *Node
	cfg     DialConfig
	decode  *actor.PID
	self    *actor.PID // the session actor the decode server watches
	session string
	peer    plan.Peer
	notices atomic.Uint64

	bound     string     // the peer name bound on the node, unbound at the end
	deadline  time.Time  // Dial retries until then
	heartbeat *heartbeat // nil when heartbeats are off

	// lostCh is closed when the decode server is lost: a call waiting
	// for its answer then returns at once rather than at the call timeout.
	lostCh chan struct{}

	mu     sync.Mutex
	ended  bool // Bye sent: the decode server leaving is no loss
	lost   error
	onLost []func(error)
	// drain is why the decode server drains (wire.Drain), "" until it
	// said so; early holds a Drain that came before the Offer was read.
	drain   string
	early   *wire.Drain
	onDrain []func(reason string)
	// onCancel hear the decode server's cancels of rooms (wire.Cancel).
	onCancel []func(room uint64, reason string)
	// cancelling are the rooms whose cancels by the decode server Attach
	// is answering, with how many are left to answer (one goroutine per
	// room, at most maxCancelling rooms at once).
	cancelling map[uint64]int
	// attached is the engine Attach added the decode pool to, which the
	// session's end removes it from (PeerRemover).
	attached Engine
}

// PeerRemover is an Engine that can forget a decode peer whose session
// ended (system.Engine.RemovePeer: nil once removed, or once the engine
// closed). When the engine Attach was given is one, Bye (and Close) remove
// the decode pool from it once the session ended, so that a prefill serving
// ever-new decode sessions keeps none of the ended ones.
type PeerRemover interface {
	RemovePeer(id string) error
}

// IdlePeerRemover is a PeerRemover that can also remove a peer still sent
// to, the moment its last chunk ends, and only while it holds the pool this
// session added (system.Engine.RemovePeerWhenIdle). Bye and Close use it
// when the engine is one, so that a session that ends before its rooms
// there did (a Close on an error path) leaves no peer behind either, and a
// late Close does not remove a later session's peer of the same id where
// the decode server gives each session an access point of its own (a
// transport that can revoke one: UCX, the loopback fabric).
type IdlePeerRemover interface {
	PeerRemover
	RemovePeerWhenIdle(p plan.Peer) error
}

var clients atomic.Uint64

// Dial opens a session with the decode server at cfg.Decode: it sends the
// prefill layout and receives the decode pool's description. Its error
// says what happened, by class: nothing listening or no answer
// (ErrUnreachable), TLS on one side only or a certificate refused or
// carrying another name than DecodeName (ErrAuthentication), another
// protocol version (ErrVersion), a layout that does not match the pool
// (ErrBadInput, naming the buffer), or the decode server's refusal with its
// reason (ErrRefused, ErrBadInput, ErrUnavailable). With ConnectTimeout it
// retries the unreachable and the unavailable.
func Dial(ctx context.Context, node *Node, cfg DialConfig) (_ *Client, err error) {
	defer func() { err = public(err) }()
	switch {
	case node == nil:
		return nil, badInput("decode.Dial needs a node")
	case node.isClosed():
		return nil, closedError("decode.Dial on a closed node")
	case cfg.Decode == "":
		return nil, badInput("DialConfig.Decode is empty: the decode server's address")
	case len(cfg.Buffers) == 0 || len(cfg.Buffers) > maxBuffers:
		return nil, badInput("DialConfig.Buffers: %d buffers (want 1 to %d)", len(cfg.Buffers), maxBuffers)
	case cfg.CallTimeout < 0 || cfg.ConnectTimeout < 0:
		return nil, badInput("DialConfig.CallTimeout %v, ConnectTimeout %v: must not be negative", cfg.CallTimeout, cfg.ConnectTimeout)
	case cfg.PageSize < 1 || cfg.PageSize > maxPageSize:
		return nil, badInput("DialConfig.PageSize %d: want the engine's page size (1 to %d tokens)", cfg.PageSize, maxPageSize)
	}
	if cfg.CP.Size > 1 {
		if err := cfg.CP.Validate(); err != nil {
			return nil, errors.Mark(errors.Wrap(err, "DialConfig.CP"), ErrBadInput)
		}
		if v, ok := cfg.Metadata[RankKey]; ok && v != strconv.Itoa(cfg.CP.Rank) {
			return nil, badInput("DialConfig.Metadata[%s] = %q, DialConfig.CP.Rank = %d: they must agree", RankKey, v, cfg.CP.Rank)
		}
		cfg.Metadata = maps.Clone(cfg.Metadata)
		if cfg.Metadata == nil {
			cfg.Metadata = map[string]string{}
		}
		cfg.Metadata[RankKey] = strconv.Itoa(cfg.CP.Rank)
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Name == "" {
		cfg.Name = node.Addr()
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	server, err := serverActor("DialConfig.Server", cfg.Server)
	if err != nil {
		return nil, err
	}
	c := &Client{node: node, cfg: cfg, decode: actor.NewPID(cfg.Decode, server), lostCh: make(chan struct{})}
	// The session actor lives as long as the session: the decode server
	// watches it to notice the prefill going away, and it watches the
	// decode server, for the opposite.
	if node.tls {
		if cfg.DecodeName == "" {
			cfg.DecodeName = DefaultDecodeName
			c.cfg.DecodeName = cfg.DecodeName
		}
		if err := node.bind(cfg.DecodeName); err != nil {
			return nil, errors.Mark(errors.Wrapf(err, "session with the decode server at %s", cfg.Decode), ErrRefused)
		}
		c.bound = cfg.DecodeName
	}
	// Nothing is spawned (and nothing watched) before the decode node is
	// known to be there: a watch of an address nobody listens at would
	// keep a connection retrying until the node closes.
	c.deadline = time.Now().Add(cfg.ConnectTimeout)
	if err := c.retry(ctx, func() error { return c.probe(ctx) }); err != nil {
		node.unbind(c.bound)
		return nil, err
	}
	n := strconv.FormatUint(clients.Add(1), 10)
	name := "kvstream-prefill-" + n
	node.policy.Allow(name)
	if c.self, err = node.system.Root.SpawnNamed(actor.PropsFromFunc(c.receive), name); err != nil {
		node.unbind(c.bound)
		return nil, errors.Wrap(err, "spawn the prefill session actor")
	}
	defer func() {
		if err != nil {
			c.release(context.Background())
		}
	}()
	hello := &wire.Hello{Version: ProtocolVersion, Prefill: cfg.Name, SessionAddress: c.self.Address,
		SessionId: c.self.Id, Metadata: maps.Clone(cfg.Metadata), PageSize: uint32(cfg.PageSize)}
	for _, b := range cfg.Buffers {
		hello.Buffers = append(hello.Buffers, &wire.Buffer{Name: b.Name, Layer: int32(b.Layer), ItemLen: b.ItemLen, Pages: uint64(max(b.Pages, 0))})
	}
	var offer *wire.Offer
	if err := c.retry(ctx, func() (err error) {
		if err = c.probe(ctx); err == nil {
			offer, err = c.helloOnce(ctx, hello)
		}
		return err
	}); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.session = offer.Session
	early := c.early
	c.early = nil
	c.mu.Unlock()
	if early != nil {
		c.drained(early)
	}
	c.peer = plan.Peer{ID: offer.PeerId, Address: offer.WorkerAddress}
	for _, r := range offer.Regions {
		c.peer.Buffers = append(c.peer.Buffers, plan.PeerBuffer{Region: rdma.RegionDesc{Addr: r.Addr, Len: r.Len, Key: r.Key}, ItemLen: r.ItemLen})
	}
	// The decode's node answering heartbeats is what a hung decode
	// process (connections open, nothing answered) stops doing.
	c.heartbeat, err = node.watchPeer(c.decode.Address, "kvstream-prefill-hb-"+n, func(err error) {
		c.peerLost(errors.Mark(errors.Wrapf(err, "decode server %s", cfg.Decode), ErrDecodeLost))
	})
	if err != nil {
		return nil, errors.Wrap(err, "heartbeats with the decode server")
	}
	return c, nil
}

// Bounds on an Offer's fields, which go to the transport as is.
const (
	maxWorkerAddress = 64 << 10
	maxKey           = 64 << 10
	maxSessionToken  = 256
)

// checkOffer checks an Offer's shape before any of it reaches the transport:
// a worker address and keys of sane sizes, one region per prefill buffer
// with its item length, a length that is a whole number of pages and does
// not wrap around. What the bytes of the worker address and keys mean is
// the transport's to check (hw/rdma/ucx checks their structure).
func checkOffer(o *wire.Offer, bufs []plan.Buffer) error {
	switch {
	case o.Session == "" || len(o.Session) > maxSessionToken:
		return errors.Newf("offered a session token of %d bytes", len(o.Session))
	case o.PeerId == "" || len(o.PeerId) > maxNameLen:
		return errors.Newf("offered a peer id of %d bytes", len(o.PeerId))
	case len(o.WorkerAddress) == 0 || len(o.WorkerAddress) > maxWorkerAddress:
		return errors.Newf("offered a worker address of %d bytes (want 1 to %d)", len(o.WorkerAddress), maxWorkerAddress)
	}
	for i, r := range o.Regions {
		switch {
		case r == nil:
			return errors.Newf("region %d: missing", i)
		case len(r.Key) == 0 || len(r.Key) > maxKey:
			return errors.Newf("region %d: a key of %d bytes (want 1 to %d)", i, len(r.Key), maxKey)
		case r.ItemLen == 0 || r.ItemLen != bufs[i].ItemLen:
			return errors.Newf("region %d: item length %d, the prefill buffer's is %d", i, r.ItemLen, bufs[i].ItemLen)
		case r.Len == 0 || r.Len%r.ItemLen != 0:
			return errors.Newf("region %d: %d bytes is not a whole number of %d-byte pages", i, r.Len, r.ItemLen)
		case r.Addr+r.Len < r.Addr:
			return errors.Newf("region %d: [%#x, +%d) wraps around", i, r.Addr, r.Len)
		}
	}
	return nil
}

// Backoff between attempts of a Dial with a ConnectTimeout.
const (
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 2 * time.Second
)

// retry runs f until it succeeds, fails in a way that is not worth
// retrying, or the Dial's ConnectTimeout is spent: a decode server not up
// yet, or busy, gets another try after a backoff.
func (c *Client) retry(ctx context.Context, f func() error) error {
	backoff := firstBackoff
	for attempt := 1; ; attempt++ {
		err := f()
		if err != nil && ctx.Err() != nil {
			// The caller gave up (a second signal): that is the news,
			// not the attempt it cut short.
			return errors.Wrapf(ctx.Err(), "dial the decode server at %s (last: %v)", c.cfg.Decode, err)
		}
		if err == nil || !(errors.Is(err, ErrUnreachable) || errors.Is(err, ErrUnavailable)) || time.Until(c.deadline) < backoff {
			if err != nil && attempt > 1 {
				err = errors.Wrapf(err, "after %d attempts in %v (the connect timeout)", attempt, c.cfg.ConnectTimeout)
			}
			return err
		}
		c.cfg.Log.Debug("decode server not ready: retrying", zap.String("decode", c.cfg.Decode), zap.Int("attempt", attempt), zap.String("error", err.Error()))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return errors.Wrapf(ctx.Err(), "dial the decode server at %s (last: %v)", c.cfg.Decode, err)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// probe checks that the decode node can be talked to (netsec.Probe:
// something listens, both sides speak the same security, its certificate
// carries DecodeName), and says what is wrong by class. It ends with ctx
// (a peer that accepts and never completes a TLS handshake would hold it
// for the whole CallTimeout).
func (c *Client) probe(ctx context.Context) error {
	addr := c.cfg.Decode
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	err := netsec.Probe(ctx, addr, c.node.tlsm, c.cfg.DecodeName)
	switch {
	case errors.Is(err, netsec.ErrUnreachable):
		return errors.Mark(errors.Wrap(err, "the decode server"), ErrUnreachable)
	case errors.Is(err, netsec.ErrAuthentication):
		return errors.Mark(errors.Wrap(err, "the decode server"), ErrAuthentication)
	case err != nil:
		return errors.Wrapf(err, "the decode server at %s", addr)
	}
	return nil
}

// helloOnce says Hello and says what went wrong by class.
func (c *Client) helloOnce(ctx context.Context, hello *wire.Hello) (*wire.Offer, error) {
	addr := c.cfg.Decode
	res, err := c.node.request(ctx, c.decode, hello, c.cfg.CallTimeout)
	switch {
	case errors.Is(err, actor.ErrDeadLetter):
		if c.cfg.Server == "" {
			return nil, errors.Mark(errors.Newf("the node at %s has no default decode server (it serves named ones only, or it is stopping)", addr), ErrRefused)
		}
		return nil, errors.Mark(errors.Newf("the node at %s has no decode server named %q (DialConfig.Server; the server's Config.Name)", addr, c.cfg.Server), ErrRefused)
	case errors.Is(err, actor.ErrTimeout) && ctx.Err() == nil:
		return nil, errors.Mark(errors.Wrapf(err, "no answer to hello from the decode server at %s within %v", addr, c.cfg.CallTimeout), ErrUnreachable)
	case err != nil:
		return nil, errors.Wrapf(err, "hello to the decode server at %s", addr)
	}
	offer, ok := res.(*wire.Offer)
	switch {
	case !ok:
		return nil, errors.Newf("the decode server at %s answered %T to hello", addr, res)
	case offer.Version != ProtocolVersion:
		return nil, errors.Mark(errors.Mark(errors.Newf("the decode server at %s speaks protocol version %d, this prefill %d: %s",
			addr, offer.Version, ProtocolVersion, offer.Error), ErrVersion), ErrBadInput)
	case offer.Code != wire.Code_OK:
		return nil, codeError(offer.Code, "decode server at %s: %s", addr, offer.Error)
	case len(offer.Regions) != len(hello.Buffers):
		return nil, errors.Newf("the decode server at %s offered %d regions for %d buffers", addr, len(offer.Regions), len(hello.Buffers))
	}
	if err := checkOffer(offer, c.cfg.Buffers); err != nil {
		return nil, errors.Mark(errors.Wrapf(err, "the decode server at %s", addr), ErrBadInput)
	}
	return offer, nil
}

// release stops the session actor and the heartbeats and unbinds the
// session, within ctx.
func (c *Client) release(ctx context.Context) {
	c.heartbeat.stop()
	// The actor's name stays allowed: the decode's late Unwatch or
	// Terminated for it must not be refused (a refused batch closes the
	// stream); a stopped actor's messages are dead letters.
	_ = c.node.stopActor(ctx, c.self)
	c.node.unbind(c.bound)
}

// codeError marks an answer's refusal with its class.
func codeError(code wire.Code, format string, args ...any) error {
	err := errors.Newf(format, args...)
	switch code {
	case wire.Code_BAD_INPUT:
		return errors.Mark(err, ErrBadInput)
	case wire.Code_VERSION:
		return errors.Mark(errors.Mark(err, ErrVersion), ErrBadInput)
	case wire.Code_ROOM_FAILED:
		return errors.Mark(err, ErrChunkFailed)
	case wire.Code_UNAVAILABLE:
		return errors.Mark(err, ErrUnavailable)
	default:
		return errors.Mark(err, ErrRefused)
	}
}

// receive is the session actor: it watches the decode server.
func (c *Client) receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		ctx.Watch(c.decode)
	case *actor.Stopping:
		// Unwatch before leaving, so that the decode server's own stop
		// later sends nothing here: protoactor-go remote panics on a
		// Terminated that arrives while this node closes (its endpoint
		// supervisor already stopped, the connection map not yet marked).
		ctx.Unwatch(c.decode)
	case *actor.Terminated:
		c.peerLost(errors.Mark(errors.Newf("decode server %s went away (%s)", fmt.Sprint(m.Who), m.Why), ErrDecodeLost))
	case *wire.Cancel:
		c.mu.Lock()
		ok := m.Session != "" && m.Session == c.session && !c.ended
		fs := c.onCancel
		c.mu.Unlock()
		if !ok {
			return // not this session's (its token is the session's secret)
		}
		reason := core.Clip(m.Reason, maxNameLen)
		c.cfg.Log.Debug("the decode server cancelled a room", zap.String("decode", c.cfg.Decode), zap.Uint64("room", m.Room), zap.String("reason", reason))
		for _, f := range fs {
			f(m.Room, reason)
		}
	case *wire.Drain:
		c.mu.Lock()
		if c.session == "" {
			// Sent right after the Offer, which Dial has not read yet.
			c.early = m
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.drained(m)
	}
}

// drained takes the decode server's Drain: one for another session (the
// token is the session's secret) is ignored; the first one calls the
// OnDrain functions.
func (c *Client) drained(m *wire.Drain) {
	reason := core.Clip(m.Reason, maxNameLen)
	if reason == "" {
		reason = "the decode server is draining"
	}
	c.mu.Lock()
	if m.Session != c.session || c.drain != "" || c.ended || c.lost != nil {
		c.mu.Unlock()
		return
	}
	c.drain = reason
	fs := c.onDrain
	c.mu.Unlock()
	c.cfg.Log.Debug("decode server draining: no new room goes to it; the rooms in flight finish, then goodbye",
		zap.String("decode", c.cfg.Decode), zap.String("reason", reason))
	for _, f := range fs {
		f(reason)
	}
}

// OnDrain calls f (on a goroutine of the node) once the decode server said
// it drains (it is stopping): register no new room toward it, finish the
// rooms in flight and say Bye, so that it stops as soon as they are done.
// If it already did, f is called at once, on the caller's goroutine
// (Attach relies on it: the engine knows the peer drains when Attach
// returns), so f must not take a lock its caller holds.
func (c *Client) OnDrain(f func(reason string)) {
	c.mu.Lock()
	reason := c.drain
	if reason == "" {
		c.onDrain = append(c.onDrain, f)
	}
	c.mu.Unlock()
	if reason != "" {
		f(reason)
	}
}

// Draining returns why the decode server drains, or "" while it does not
// (or did not say so).
func (c *Client) Draining() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drain
}

// Peer is the decode pool as the prefill engine needs it
// (system.Engine.AddPeer); Attach adds it.
func (c *Client) Peer() plan.Peer { return c.peer }

// Engine is what Attach needs of the prefill engine (*system.Engine).
type Engine interface {
	AddPeer(plan.Peer) error
	PeerLost(id string, cause error) error
	PeerDraining(id string, reason string) error
	// CancelRoom drops the room if it sends to the peer, refuses its later
	// chunks toward the peer, and returns nil only once no write of it can
	// land there (system.Engine.CancelRoom).
	CancelRoom(ctx context.Context, peer string, room uint64, reason string) error
}

// maxCancelling bounds the decode server's cancels Attach answers at once;
// one past it is not answered (the decode keeps that room's pages out
// until the session's access is revoked: safe, and only a flooding decode
// gets there).
const maxCancelling = 1024

// Attach adds the decode pool to the engine as a peer and tells the engine
// when the decode server is lost (system.Engine.PeerLost: its work fails at
// once) and when it drains (system.Engine.PeerDraining: new rooms toward it
// are refused, those in flight go on), and answers the decode server's
// cancel of a room: the engine cancels it toward this decode
// (system.Engine.CancelRoom: a room sending to it is dropped, no further
// group or chunk of it is posted to it, and the call returns once no write
// of the room can land there), then the decode server is told (Cancel),
// which frees the pages. The answer says the writes stopped only when
// CancelRoom returned nil; any other error keeps the pages out (not
// quiesced). A room that sends nothing to this decode is left alone.
func (c *Client) Attach(eng Engine) error {
	if err := eng.AddPeer(c.peer); err != nil {
		return public(err)
	}
	c.mu.Lock()
	c.attached = eng
	c.mu.Unlock()
	c.OnLost(func(cause error) { _ = eng.PeerLost(c.peer.ID, cause) })
	c.OnDrain(func(reason string) { _ = eng.PeerDraining(c.peer.ID, reason) })
	c.OnCancel(func(room uint64, reason string) {
		c.mu.Lock()
		if c.cancelling == nil {
			c.cancelling = map[uint64]int{}
		}
		busy, full := c.cancelling[room] > 0, len(c.cancelling) >= maxCancelling
		if busy || !full {
			c.cancelling[room]++
		}
		c.mu.Unlock()
		switch {
		case busy:
			// The goroutine in progress answers it next: one answer per
			// cancel (the decode may have cancelled the room, then a room
			// of the same id Expected again).
			return
		case full:
			c.cfg.Log.Warn("the decode server's cancel is not answered: too many in progress (its pages stay out until the session ends)",
				zap.String("decode", c.cfg.Decode), zap.Uint64("room", room), zap.Int("in_progress", maxCancelling))
			return
		}
		go func() {
			for {
				c.answerCancel(eng, room, reason)
				c.mu.Lock()
				c.cancelling[room]--
				left := c.cancelling[room]
				if left == 0 {
					delete(c.cancelling, room)
				}
				c.mu.Unlock()
				if left == 0 {
					return
				}
			}
		}()
	})
	return nil
}

// answerCancel cancels the room in the engine, toward this decode, and
// answers the decode server's cancel.
func (c *Client) answerCancel(eng Engine, room uint64, reason string) {
	err := eng.CancelRoom(context.Background(), c.peer.ID, room, reason)
	if err != nil && !errors.Is(err, ErrNotQuiesced) {
		// Only nil says no write can land: anything else (the engine
		// closed, a bug's timeout) keeps the pages out.
		err = errors.Mark(err, ErrNotQuiesced)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CallTimeout)
	defer cancel()
	if err := c.Cancel(ctx, room, "dropped: "+reason, err); err != nil {
		c.cfg.Log.Warn("answer the decode server's cancel", zap.Uint64("room", room), zap.String("error", err.Error()))
	}
}

// OnCancel calls f (on a goroutine of the node; it must not block) when the
// decode server cancels a room (Server.Cancel): cancel the room in the
// engine (system.Engine.CancelRoom, which also refuses its later chunks),
// then answer with Cancel, so that the decode server frees its pages.
// Attach does both.
func (c *Client) OnCancel(f func(room uint64, reason string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onCancel = append(c.onCancel, f)
}

// Cancel tells the decode server the room is cancelled on this side: call
// it once the engine's Drop of the room returned, with Drop's error
// (dropErr), so that the decode server frees the room's pages, which no
// write can reach any more, unless dropErr is marked ErrNotQuiesced (they
// stay out until this session's access is revoked). It cancels a room the
// prefill gave up (its client aborted: the room fails on the decode side,
// ErrCancelled), and answers the decode server's cancel (OnCancel). A room
// that completed or failed first keeps its outcome. The error is the decode
// server's refusal (ErrRefused: not this session's room), ErrDecodeLost,
// or ctx's.
func (c *Client) Cancel(ctx context.Context, room uint64, reason string, dropErr error) error {
	c.mu.Lock()
	ended := c.ended
	c.mu.Unlock()
	if ended {
		return public(closedError("Cancel"))
	}
	if lost := c.Lost(); lost != nil {
		return lost
	}
	msg := &wire.Cancel{Session: c.session, Room: room, Reason: wireText(reason), NotQuiesced: errors.Is(dropErr, ErrNotQuiesced)}
	res, err := c.request(ctx, msg)
	if err != nil {
		if lost := c.Lost(); lost != nil {
			return lost
		}
		return public(errors.Wrapf(err, "room %d: cancel", room))
	}
	a, ok := res.(*wire.NoticeAck)
	switch {
	case !ok:
		return public(errors.Newf("room %d: the decode server answered %T to a cancel", room, res))
	case a.Code != wire.Code_OK:
		return public(codeError(a.Code, "decode server: %s", a.Error))
	}
	return nil
}

// OnLost calls f (on a goroutine of the node) when the decode server goes
// away before Bye; at once if it already did.
func (c *Client) OnLost(f func(error)) {
	c.mu.Lock()
	lost := c.lost
	if lost == nil {
		c.onLost = append(c.onLost, f)
	}
	c.mu.Unlock()
	if lost != nil {
		f(lost)
	}
}

func (c *Client) peerLost(err error) {
	c.mu.Lock()
	if c.ended || c.lost != nil {
		c.mu.Unlock()
		return
	}
	c.lost = err
	close(c.lostCh)
	fs := c.onLost
	c.mu.Unlock()
	c.cfg.Log.Warn("decode server lost", zap.String("decode", c.cfg.Decode), zap.String("error", err.Error()))
	for _, f := range fs {
		f(public(err))
	}
}

// request sends msg to the decode server and waits for its answer, within
// the call timeout, ctx, and the session: a server declared lost meanwhile
// (killed mid-call) ends the wait at once, with ctx's error wrapped; the
// caller checks Lost.
func (c *Client) request(ctx context.Context, msg any) (any, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.lostCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	return c.node.request(ctx, c.decode, msg, c.cfg.CallTimeout)
}

// Lost returns why the decode server was lost (marked ErrDecodeLost), or
// nil.
func (c *Client) Lost() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return public(c.lost)
}

// Notify tells the decode server how a chunk ended, after the engine's
// Finish (or Drop) returned for it: a chunk reported successful must have
// every byte landed, and a failed one must have stopped writing, which
// Finish and Drop guarantee unless their error is marked ErrNotQuiesced
// (sent along). The error is the decode server's refusal (ErrBadInput with
// the value, ErrChunkFailed when its Verify rejected the bytes, ErrRefused),
// ErrDecodeLost, or ctx's.
func (c *Client) Notify(ctx context.Context, n Notice) error {
	c.mu.Lock()
	ended := c.ended
	c.mu.Unlock()
	if ended {
		return public(closedError("Notify"))
	}
	if lost := c.Lost(); lost != nil {
		return lost
	}
	if len(n.Positions) != len(n.DstPages) {
		return public(badInput("room %d notice: %d positions, %d pages", n.Result.Chunk.Room, len(n.Positions), len(n.DstPages)))
	}
	r := n.Result
	msg := &wire.ChunkNotice{Session: c.session, Room: r.Chunk.Room, Start: int64(r.Chunk.Start), End: int64(r.Chunk.End),
		Last: n.Last, Bytes: r.Stats.Bytes, Positions: make([]int64, len(n.Positions)), DstPages: make([]int64, len(n.DstPages))}
	switch r.Status {
	case messages.Succeeded:
		msg.Status = wire.Status_SUCCEEDED
	case messages.Dropped:
		msg.Status = wire.Status_DROPPED
	default:
		msg.Status = wire.Status_FAILED
	}
	if r.Err != nil {
		msg.Error = wireText(r.Err.Error())
		msg.NotQuiesced = errors.Is(r.Err, ErrNotQuiesced)
	}
	for i := range n.Positions {
		msg.Positions[i], msg.DstPages[i] = int64(n.Positions[i]), int64(n.DstPages[i])
	}
	c.notices.Add(1)
	res, err := c.request(ctx, msg)
	if err != nil {
		if lost := c.Lost(); lost != nil {
			return lost
		}
		err = errors.Wrapf(err, "room %d chunk [%d, %d): notice", msg.Room, msg.Start, msg.End)
		if errors.Is(err, actor.ErrTimeout) && ctx.Err() == nil {
			// No answer within the call timeout from a server whose
			// session is alive: a busy one may still act on the notice,
			// and its answer to Bye counts it.
			err = errors.Mark(err, ErrUnreachable)
		}
		return public(err)
	}
	a, ok := res.(*wire.NoticeAck)
	switch {
	case !ok:
		return public(errors.Newf("room %d: the decode server answered %T to a notice", msg.Room, res))
	case a.Code != wire.Code_OK:
		return public(codeError(a.Code, "decode server: %s", a.Error))
	}
	return nil
}

// Summary is the decode server's view of the session, answered to Bye.
type Summary struct {
	Chunks, Failed int // notices it accepted, and of which not successful or refused
}

// Bye ends the session: aborted is nil when the prefill sent every chunk
// it meant to, else why it stopped early (the decode server then reports
// the session, and its unfinished rooms, aborted). Send it after the
// engine finished or dropped every chunk to this decode server (after
// Engine.Close, say), so that nothing writes its pages any more. The error
// is the decode server's verdict when the session is not complete
// (ErrChunkFailed, ErrSessionAborted...), ErrDecodeLost, or ctx's; Summary
// holds what it counted. Bye stops the session actor; a second Bye is an
// error marked ErrClosed.
func (c *Client) Bye(ctx context.Context, aborted error) (Summary, error) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return Summary{}, public(closedError("Bye"))
	}
	c.ended = true
	lost := c.lost
	eng := c.attached
	c.mu.Unlock()
	defer c.release(ctx)
	defer c.detach(eng)
	if lost != nil {
		return Summary{}, public(lost)
	}
	bye := &wire.Bye{Session: c.session, Chunks: c.notices.Load()}
	if aborted != nil {
		bye.Aborted = wireText(aborted.Error())
	}
	res, err := c.request(ctx, bye)
	if err != nil {
		return Summary{}, public(errors.Wrap(err, "bye"))
	}
	s, ok := res.(*wire.Summary)
	if !ok {
		return Summary{}, public(errors.Newf("the decode server answered %T to bye", res))
	}
	sum := Summary{Chunks: int(s.Chunks), Failed: int(s.Failed)}
	if s.Code != wire.Code_OK {
		err := codeError(s.Code, "decode server: session not complete: %s", s.Error)
		if aborted != nil {
			err = errors.Mark(err, ErrSessionAborted)
		}
		return sum, public(err)
	}
	return sum, nil
}

// detach removes the decode pool from the engine Attach added it to, when
// that engine can. An IdlePeerRemover removes it now, or once its last
// chunk ends if the session ended before its rooms there did. A
// PeerRemover only refuses a peer still sent to (Bye before every chunk to
// this decode finished or was dropped): the peer stays, said at WARN.
func (c *Client) detach(eng Engine) {
	var err error
	switch r := eng.(type) {
	case IdlePeerRemover:
		err = r.RemovePeerWhenIdle(c.peer)
	case PeerRemover:
		err = r.RemovePeer(c.peer.ID)
	default:
		return
	}
	if err != nil {
		c.cfg.Log.Warn("the engine keeps the decode peer after its session ended (finish or drop its rooms, then Engine.RemovePeer)",
			zap.String("decode", c.cfg.Decode), zap.String("peer", c.peer.ID), zap.Error(err))
	}
}

// Close says Bye (as aborted, "closed without Bye") if the session has not
// ended, within ctx, and stops the session actor. It does not stop the
// node.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	ended := c.ended
	c.mu.Unlock()
	if ended {
		return nil
	}
	_, err := c.Bye(ctx, errors.New("closed without Bye"))
	if errors.Is(err, ErrSessionAborted) || errors.Is(err, ErrDecodeLost) {
		return nil // what closing without Bye means
	}
	return err
}
