package twoproc

import (
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/internal/workload"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// callTimeout bounds one control-plane round trip.
const callTimeout = 10 * time.Second

// Prefill is the prefill process's side of the control plane: a
// workload.DataPlane whose decode side is another process.
type Prefill struct {
	node    *node
	decode  *actor.PID
	session *actor.PID
	tr      rdma.Transport

	mu       sync.Mutex
	closing  bool // after Bye the decode process leaves: that is no loss
	onLost   func(error)
	lost     error
	verified uint64
	notices  int
	mismatch string
	summary  *wire.Summary
}

var _ workload.DataPlane = (*Prefill)(nil)

// NewPrefill starts a node on listen and targets the decode process at
// decodeAddr; data goes over tr.
func NewPrefill(listen, decodeAddr string, tr rdma.Transport, log *zap.Logger) (*Prefill, error) {
	n, err := startNode(listen, log)
	if err != nil {
		return nil, err
	}
	p := &Prefill{node: n, decode: actor.NewPID(decodeAddr, DecodeActor), tr: tr}
	// The session actor lives as long as this process: the decode side
	// watches it to notice the prefill going away. It also watches the
	// decode actor, for the opposite.
	if p.session, err = n.system.Root.SpawnNamed(watcher(p.decode, p.peerLost), "prefill-session"); err != nil {
		n.stop()
		return nil, err
	}
	return p, nil
}

// Open asks the decode process for a pool of geom and returns its peer.
func (p *Prefill) Open(geom testbed.Geometry, seed uint64, _ *zap.Logger) (rdma.Transport, system.Peer, error) {
	hello := &wire.Hello{Prefill: p.node.Addr(), Pages: uint64(geom.Pages), Seed: seed,
		SessionAddress: p.session.Address, SessionId: p.session.Id}
	for i, l := range geom.Layers {
		hello.Buffers = append(hello.Buffers, &wire.Buffer{Name: geom.Names[i], Layer: int32(l), ItemLen: geom.ItemLen})
	}
	res, err := p.node.system.Root.RequestFuture(p.decode, hello, callTimeout).Result()
	if err != nil {
		return nil, system.Peer{}, errors.Wrapf(err, "hello to the decode process at %s", p.decode.Address)
	}
	offer, ok := res.(*wire.Offer)
	if !ok {
		return nil, system.Peer{}, errors.Newf("decode process answered %T to hello", res)
	}
	if offer.Error != "" {
		return nil, system.Peer{}, errors.Newf("decode process: %s", offer.Error)
	}
	peer := system.Peer{ID: offer.PeerId, Address: offer.WorkerAddress}
	for _, r := range offer.Regions {
		peer.Buffers = append(peer.Buffers, system.PeerBuffer{Region: rdma.RegionDesc{Addr: r.Addr, Len: r.Len, Key: r.Key}, ItemLen: r.ItemLen})
	}
	return p.tr, peer, nil
}

// OnPeerLost sets what to do when the decode process is lost.
func (p *Prefill) OnPeerLost(f func(error)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onLost = f
	if p.lost != nil {
		f(p.lost)
	}
}

func (p *Prefill) peerLost(err error) {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return
	}
	p.lost = err
	f := p.onLost
	p.mu.Unlock()
	if f != nil {
		f(err)
	}
}

// Lost returns why the decode process was lost, or nil.
func (p *Prefill) Lost() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// ChunkDone sends a finished chunk to the decode process for verification.
func (p *Prefill) ChunkDone(n workload.Notice) {
	if p.Lost() != nil {
		return
	}
	msg := &wire.ChunkNotice{Room: n.Room, Start: int64(n.Start), End: int64(n.End), Status: n.Status.String(), Bytes: n.Bytes}
	if n.Err != nil {
		msg.Error = n.Err.Error()
	}
	for i := range n.Positions {
		msg.Positions = append(msg.Positions, int64(n.Positions[i]))
		msg.DstPages = append(msg.DstPages, int64(n.DstPages[i]))
	}
	res, err := p.node.system.Root.RequestFuture(p.decode, msg, callTimeout).Result()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notices++
	ack, ok := res.(*wire.NoticeAck)
	switch {
	case err != nil:
		if p.mismatch == "" && p.lost == nil {
			p.mismatch = "decode process did not acknowledge a chunk: " + err.Error()
		}
	case !ok:
		p.mismatch = "decode process answered a notice with something else"
	default:
		p.verified += ack.VerifiedPages
		if p.mismatch == "" {
			p.mismatch = ack.Mismatch
		}
	}
}

// Verify returns the decode process's first mismatch, or "".
func (p *Prefill) Verify(*testbed.Pool) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mismatch
}

// Verified returns how many pages (x buffers) the decode process checked.
func (p *Prefill) Verified() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.verified
}

// Close says goodbye (when the decode process is still there) and stops
// the node.
func (p *Prefill) Close() error {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	if p.Lost() == nil {
		if res, err := p.node.system.Root.RequestFuture(p.decode, &wire.Bye{Chunks: uint64(p.notices)}, callTimeout).Result(); err == nil {
			if s, ok := res.(*wire.Summary); ok {
				p.mu.Lock()
				p.summary = s
				p.mu.Unlock()
			}
		}
	}
	p.node.stop()
	return nil
}
