package decode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/system"
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
	DefaultID          = "decode"
	DefaultMaxSessions = 64
	DefaultByeGrace    = 10 * time.Second
	// DefaultMaxPoolBytes bounds a pool sized by Config.Size: 64 GiB.
	DefaultMaxPoolBytes = 64 << 30
	// maxBuffers bounds a Hello's layout before anything is sized by it.
	maxBuffers = 1 << 16
)

// Server is the decode side of kvstream: it owns the registration of the
// decode pool with the transport, answers prefill sessions on its Node, and
// tells the serving stack per room when the KV landed (Wait) or why it
// will not.
type Server struct {
	node *Node
	tr   rdma.Transport
	cfg  Config
	log  *zap.Logger
	pid  *actor.PID

	mu       sync.Mutex
	bufs     []Buffer
	pages    int // the smallest buffer's capacity: the valid page range
	regions  []rdma.Region
	rooms    map[uint64]*room
	sessions map[string]*Session // by token
	watched  map[string]*Session // by the prefill session actor's PID
	accepted []*Session          // not yet returned by Accept
	acceptCh chan struct{}       // closed and replaced when a session arrives
	// lostRanks are a group's ranks whose last session was lost, until one
	// of theirs says Hello again.
	lostRanks map[int]error
	closed    bool
}

// room is one room's state; done closes when it is complete or failed.
type room struct {
	Room
	session *Session // the session that reports it; nil until its first notice
	// group decides a room of a CP group (Config.Group); reporters are the
	// ranks' sessions that reported in it.
	group     *GroupRoom
	reporters map[*Session]bool
	err       error
	done      chan struct{}
}

func (r *room) terminal() bool { return r.Complete || r.err != nil }

func (r *room) fail(err error) {
	if r.terminal() {
		return
	}
	r.err = err
	close(r.done)
}

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
	case cfg.ByeGrace < 0:
		return nil, badInput("ByeGrace %v: must not be negative", cfg.ByeGrace)
	}
	if cfg.Group != nil {
		if err := cfg.Group.validate(); err != nil {
			return nil, err
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
	if cfg.ByeGrace == 0 {
		cfg.ByeGrace = DefaultByeGrace
	}
	if cfg.MaxPoolBytes == 0 {
		cfg.MaxPoolBytes = DefaultMaxPoolBytes
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{node: node, tr: tr, cfg: cfg, log: log, rooms: map[uint64]*room{},
		sessions: map[string]*Session{}, watched: map[string]*Session{}, acceptCh: make(chan struct{})}
	if len(cfg.Buffers) > 0 {
		if err := s.size(cfg.Buffers); err != nil {
			return nil, err
		}
	}
	node.policy.Allow(name)
	if s.pid, err = node.system.Root.SpawnNamed(actor.PropsFromFunc(s.receive), name); err != nil {
		s.release()
		return nil, errors.Wrapf(err, "spawn %s on node %s (Servers that share a node need distinct Config.Names)", name, node.Addr())
	}
	return s, nil
}

// size validates the pool and registers it; called with mu held or before
// the actor exists. On error nothing stays registered.
func (s *Server) size(bufs []Buffer) error {
	if len(bufs) > maxBuffers {
		return badInput("decode pool of %d buffers: at most %d", len(bufs), maxBuffers)
	}
	pages := 0
	for i, b := range bufs {
		switch {
		case b.ItemLen == 0:
			return badInput("decode buffer %d (%s): zero item length", i, b.Name)
		case b.Pages < 1:
			return badInput("decode buffer %d (%s): %d pages", i, b.Name, b.Pages)
		case b.Base == 0:
			return badInput("decode buffer %d (%s): nil base address", i, b.Name)
		case b.ItemLen > (1<<63)/uint64(b.Pages):
			return badInput("decode buffer %d (%s): %d pages of %d bytes overflow", i, b.Name, b.Pages, b.ItemLen)
		}
		if i == 0 || b.Pages < pages {
			pages = b.Pages
		}
	}
	var regions []rdma.Region
	for i, b := range bufs {
		r, err := s.tr.Register(b.Base, b.ItemLen*uint64(b.Pages))
		if err != nil {
			for _, r := range regions {
				_ = r.Deregister()
			}
			return errors.Wrapf(err, "register decode buffer %d (%s)", i, b.Name)
		}
		regions = append(regions, r)
	}
	s.bufs, s.pages, s.regions = slices.Clone(bufs), pages, regions
	return nil
}

// Peer describes the pool to a prefill engine in this process
// (system.Engine.AddPeer); a prefill in another process gets the same
// through Dial. It is an error while a pool sized by Config.Size has not
// been sized yet.
func (s *Server) Peer() (system.Peer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.regions == nil {
		return system.Peer{}, public(badInput("the decode pool is not sized yet (Config.Size runs at the first Hello)"))
	}
	return s.peerLocked(), nil
}

func (s *Server) peerLocked() system.Peer {
	p := system.Peer{ID: s.cfg.ID, Address: s.tr.Address()}
	for i, r := range s.regions {
		p.Buffers = append(p.Buffers, system.PeerBuffer{Region: r.Desc(), ItemLen: s.bufs[i].ItemLen})
	}
	return p
}

// Addr is the address a prefill dials: the node's.
func (s *Server) Addr() string { return s.node.Addr() }

// Expect declares a room before its prefill writes it: pages are the decode
// pages the serving stack allocated for the request, in position order
// (the DecodeInfo.DstPages the prefill registers). Notices for the room are
// checked against them. A page outside the pool, a duplicate page, or a
// room already expected and not Released is an error marked ErrBadInput
// that names the value; nothing changes.
func (s *Server) Expect(id uint64, pages []int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return public(closedError("Expect"))
	case s.regions == nil:
		return public(badInput("room %d: the decode pool is not sized yet", id))
	case len(pages) == 0:
		return public(badInput("room %d: no pages", id))
	case s.rooms[id] != nil:
		return public(badInput("room %d is already expected: Release it first", id))
	}
	seen := make(map[int]int, len(pages))
	for i, p := range pages {
		if p < 0 || p >= s.pages {
			return public(badInput("room %d: page %d at index %d is outside the pool of %d pages", id, p, i, s.pages))
		}
		if j, dup := seen[p]; dup {
			return public(badInput("room %d: page %d at index %d duplicates index %d", id, p, i, j))
		}
		seen[p] = i
	}
	r := &room{Room: Room{ID: id, Pages: slices.Clone(pages)}, done: make(chan struct{})}
	s.rooms[id] = r
	s.watchRoom(r)
	if s.cfg.Group != nil {
		r.group, _ = NewGroupRoom(*s.cfg.Group, id, len(pages)) // the Group was validated by New
		s.groupRoomStarted(r)
	}
	return nil
}

// Wait returns the room once its last chunk's bytes landed and every chunk
// of it succeeded (Room.Complete), or an error that says why the room must
// not be decoded: ErrChunkFailed (a chunk failed or was refused),
// ErrPrefillLost, ErrSessionAborted, ErrClosed, or ctx's error. Pages of a
// room whose error is marked ErrNotQuiesced may still be written: do not
// reuse them for another room. An unknown room (never Expected nor created
// by a notice, or Released) is an error marked ErrBadInput.
func (s *Server) Wait(ctx context.Context, id uint64) (Room, error) {
	s.mu.Lock()
	r := s.rooms[id]
	s.mu.Unlock()
	if r == nil {
		return Room{}, public(badInput("room %d is unknown: Expect it first", id))
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return Room{}, public(errors.Wrapf(ctx.Err(), "wait for room %d", id))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := r.Room
	out.Chunks = slices.Clone(r.Chunks)
	return out, public(r.err)
}

// Release forgets a room: its id may be Expected again. The serving stack
// releases a room once it no longer needs its pages' KV. Releasing a room
// still in progress abandons it on this side only: the prefill may still
// write its pages, and its later notices are refused. An unknown room is
// an error marked ErrBadInput.
func (s *Server) Release(id uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rooms[id]
	if r == nil {
		return public(badInput("room %d is unknown", id))
	}
	r.fail(errors.Mark(errors.Newf("room %d released while in progress", id), ErrBadInput))
	delete(s.rooms, id)
	return nil
}

// Accept returns the next prefill session that said Hello (sessions are
// served whether or not anyone accepts them; Accept is how the serving
// stack learns of them, to log them or to wait for their end). It returns
// within ctx.
func (s *Server) Accept(ctx context.Context) (*Session, error) {
	for {
		s.mu.Lock()
		if len(s.accepted) > 0 {
			ss := s.accepted[0]
			s.accepted = s.accepted[1:]
			s.mu.Unlock()
			return ss, nil
		}
		if s.closed {
			s.mu.Unlock()
			return nil, public(closedError("Accept"))
		}
		ch := s.acceptCh
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, public(errors.Wrap(ctx.Err(), "accept a prefill session"))
		}
	}
}

// Close ends every session and room (ErrClosed), stops the server's actor
// and deregisters the pool; it does not stop the node. It returns within
// ctx (the actor's stop then finishes in the background). A second Close
// returns nil.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	cause := errors.Mark(errors.New("decode server closed"), ErrClosed)
	for _, r := range s.rooms {
		r.fail(cause)
	}
	var hbs []*heartbeat
	for _, ss := range s.sessions {
		ss.end(cause)
		hbs = append(hbs, ss.heartbeat)
		ss.heartbeat = nil
	}
	close(s.acceptCh)
	s.mu.Unlock()
	for _, hb := range hbs {
		hb.stop()
	}
	err := s.node.stopActor(ctx, s.pid)
	s.mu.Lock()
	s.release()
	s.mu.Unlock()
	return public(err)
}

func (s *Server) release() {
	for _, r := range s.regions {
		_ = r.Deregister()
	}
	s.regions = nil
}

// watchRoom calls Config.OnRoomEnd when r ends; the goroutine ends with
// the room, which Close ends at the latest.
func (s *Server) watchRoom(r *room) {
	if s.cfg.OnRoomEnd == nil {
		return
	}
	go func() {
		<-r.done
		s.mu.Lock()
		out := r.Room
		out.Chunks = slices.Clone(r.Chunks)
		err := r.err
		s.mu.Unlock()
		s.cfg.OnRoomEnd(out, public(err))
	}()
}

// newToken names a session; the prefill's later messages carry it.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
