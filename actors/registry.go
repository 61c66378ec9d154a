package actors

import (
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
)

// Registry is a read model of the rooms' queues, kept by the room shells, so
// that the façade answers "is this chunk already registered?" and "does this
// room exist?" without a round trip through the actors. The scheduler
// re-registers the same requests about nine times while forming a batch
// (invariant 11: that must be cheap). The room actors stay the authority: a
// registration the registry does not know goes to them and is deduplicated
// there.
type Registry struct {
	mu     sync.RWMutex
	queued map[messages.ChunkKey]registered
	rooms  map[uint64]int // live contexts per room (queued or finishing)
	// sending are the decode peers of each chunk's real destinations, from
	// its hand-off to the manager (Sending) to its end; toPeer counts them
	// per peer, so that a peer is forgotten only once nothing sends to it.
	sending map[messages.Chunk][]string
	toPeer  map[string]int
	// watched are the peers whose last chunk someone waits for
	// (WatchIdle): onIdle hears each once, when its count reaches 0.
	watched map[string]bool
	onIdle  func(peer string)
}

type registered struct {
	added messages.Added
	spec  any // what the façade registered, to check later registrations against
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{queued: map[messages.ChunkKey]registered{}, rooms: map[uint64]int{},
		sending: map[messages.Chunk][]string{}, toPeer: map[string]int{}, watched: map[string]bool{}}
}

// OnPeerIdle sets what hears that a watched peer's last live chunk ended
// (WatchIdle). It is called where the end was seen, after the registry's
// lock is released: on the chunk's host before the chunk answers its Finish
// or Drop, or on Register's goroutine for a chunk not handed over (NotSent).
// It may take a lock whose holders never wait on a chunk, nothing longer:
// a host waits with it. Set it before the first chunk is sent.
func (r *Registry) OnPeerIdle(f func(peer string)) {
	r.mu.Lock()
	r.onIdle = f
	r.mu.Unlock()
}

// WatchIdle returns how many live chunks send to peer and, when some do,
// has OnPeerIdle's function hear the moment the last of them ends (once).
// Counting and watching under one lock, no chunk's end falls between them.
func (r *Registry) WatchIdle(peer string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.toPeer[peer]
	if n > 0 {
		r.watched[peer] = true
	}
	return n
}

// Sending records that chunk c, about to be handed to the manager, sends
// to peers (its real destinations' peers), until it ends or NotSent says
// it was not spawned.
func (r *Registry) Sending(c messages.Chunk, peers []string) {
	if len(peers) == 0 {
		return
	}
	r.mu.Lock()
	r.sending[c] = peers
	for _, p := range peers {
		r.toPeer[p]++
	}
	r.mu.Unlock()
}

// NotSent forgets what Sending recorded for a chunk the manager did not
// spawn (a concurrent registration of its key won).
func (r *Registry) NotSent(c messages.Chunk) {
	r.mu.Lock()
	idle, f := r.unsend(c)
	r.mu.Unlock()
	notifyIdle(idle, f)
}

// unsend forgets c's peers, and returns those of them watched whose last
// chunk it was, with the function that hears of them; r.mu is held.
func (r *Registry) unsend(c messages.Chunk) (idle []string, onIdle func(string)) {
	peers, ok := r.sending[c]
	if !ok {
		return nil, nil
	}
	delete(r.sending, c)
	for _, p := range peers {
		if r.toPeer[p]--; r.toPeer[p] <= 0 {
			delete(r.toPeer, p)
			if r.watched[p] {
				delete(r.watched, p)
				idle = append(idle, p)
			}
		}
	}
	return idle, r.onIdle
}

// notifyIdle tells f of the peers unsend found idle; no lock is held.
func notifyIdle(idle []string, f func(string)) {
	if f == nil {
		return
	}
	for _, p := range idle {
		f(p)
	}
}

// ToPeer returns how many live chunks send to a decode peer.
func (r *Registry) ToPeer(peer string) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.toPeer[peer]
}

// Lookup returns the queued context with key k, and the spec remembered
// for it (nil if none yet).
func (r *Registry) Lookup(k messages.ChunkKey) (messages.Added, any, bool) {
	r.mu.RLock()
	e, ok := r.queued[k]
	r.mu.RUnlock()
	e.added.Existing = ok
	return e.added, e.spec, ok
}

// Remember keeps the spec chunk c was registered with while c is queued, so
// that a later registration of its key can be checked against it.
func (r *Registry) Remember(c messages.Chunk, spec any) {
	r.mu.Lock()
	if e, ok := r.queued[c.ChunkKey]; ok && e.added.Chunk == c {
		e.spec = spec
		r.queued[c.ChunkKey] = e
	}
	r.mu.Unlock()
}

// HasRoom reports whether the room has a live chunk context.
func (r *Registry) HasRoom(room uint64) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.rooms[room] > 0
}

// Rooms returns the rooms with a live chunk context.
func (r *Registry) Rooms() []uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]uint64, 0, len(r.rooms))
	for room := range r.rooms {
		out = append(out, room)
	}
	return out
}

// RoomCount returns the number of rooms with a live chunk context.
func (r *Registry) RoomCount() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.rooms)
}

// Live returns the number of live chunk contexts.
func (r *Registry) Live() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for _, c := range r.rooms {
		n += c
	}
	return n
}

func (r *Registry) spawned(c messages.Chunk, perLayer bool) {
	r.mu.Lock()
	r.queued[c.ChunkKey] = registered{added: messages.Added{Chunk: c, PerLayer: perLayer}}
	r.rooms[c.Room]++
	r.mu.Unlock()
}

func (r *Registry) unqueued(c messages.Chunk) {
	r.mu.Lock()
	if e, ok := r.queued[c.ChunkKey]; ok && e.added.Chunk == c {
		delete(r.queued, c.ChunkKey)
	}
	r.mu.Unlock()
}

func (r *Registry) ended(c messages.Chunk) {
	r.mu.Lock()
	if e, ok := r.queued[c.ChunkKey]; ok && e.added.Chunk == c {
		delete(r.queued, c.ChunkKey)
	}
	if r.rooms[c.Room]--; r.rooms[c.Room] <= 0 {
		delete(r.rooms, c.Room)
	}
	idle, f := r.unsend(c)
	r.mu.Unlock()
	notifyIdle(idle, f)
}

// Peers is the table of decode peers, written by AddPeer and read by
// submitters when they connect.
type Peers struct {
	mu    sync.RWMutex
	peers map[string]*plan.Peer
	lost  map[string]error
	drain map[string]error // peers draining: no new room goes to them
}

// ErrPeerLost marks work for a decode peer the engine was told is gone.
var ErrPeerLost = errors.New("decode peer lost")

// ErrPeerDraining marks a new room refused because its decode peer drains
// (it is stopping): route the request to another decode.
var ErrPeerDraining = errors.New("decode peer draining")

// NewPeers returns an empty table.
func NewPeers() *Peers {
	return &Peers{peers: map[string]*plan.Peer{}, lost: map[string]error{}, drain: map[string]error{}}
}

// Drain marks a peer draining: new rooms toward it are refused from now on,
// the rooms in flight go on. The first reason stays; first says whether
// this call marked it.
func (p *Peers) Drain(id, reason string) (first bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.peers[id]; !ok {
		return false, badInput("unknown peer %q", id)
	}
	if _, ok := p.drain[id]; ok {
		return false, nil
	}
	if reason == "" {
		reason = "no reason given"
	}
	p.drain[id] = errors.Mark(errors.Newf("decode peer %q is draining (%s): it takes no new room", id, reason), ErrPeerDraining)
	return true, nil
}

// Draining returns why a peer drains, or nil.
func (p *Peers) Draining(id string) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.drain[id]
}

// Lose marks a peer gone: work for it fails at once from now on. It
// returns the record it marked.
func (p *Peers) Lose(id string, cause error) (*plan.Peer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rec, ok := p.peers[id]
	if !ok {
		return nil, badInput("unknown peer %q", id)
	}
	if cause == nil {
		cause = errors.New("no cause given")
	}
	p.lost[id] = errors.Mark(errors.Mark(errors.Wrapf(cause, "peer %q lost", id), ErrPeerLost), rdma.ErrEndpointBroken)
	return rec, nil
}

// Lost returns why a peer was lost, or nil.
func (p *Peers) Lost(id string) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.lost[id]
}

// Remove forgets a peer: its record, which it returns, and its lost and
// draining marks. The id may be added again.
func (p *Peers) Remove(id string) (*plan.Peer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rec, ok := p.peers[id]
	if !ok {
		return nil, badInput("unknown peer %q", id)
	}
	delete(p.peers, id)
	delete(p.lost, id)
	delete(p.drain, id)
	return rec, nil
}

// Len returns how many peers the table holds.
func (p *Peers) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.peers)
}

// Get returns a peer by id.
func (p *Peers) Get(id string) (*plan.Peer, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	peer, ok := p.peers[id]
	return peer, ok
}

// Add inserts a peer; it fails if the id exists.
func (p *Peers) Add(peer *plan.Peer) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.peers[peer.ID]; dup {
		return badInput("peer %q already added", peer.ID)
	}
	p.peers[peer.ID] = peer
	return nil
}
