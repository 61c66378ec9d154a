package simsession

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// A cluster run sends one batch of the sim workload after another through
// the same sessions: the decode side tells a batch's rooms apart by the
// batch in the room id's high bits, and its bytes by a seed per batch (a
// page left over from an earlier batch never passes for a later one).
const batchShift = 24

// BatchRoom is the room id the decode side sees for room of batch.
func BatchRoom(batch int, room uint64) uint64 { return uint64(batch)<<batchShift | room }

// SplitRoom is BatchRoom's inverse.
func SplitRoom(id uint64) (batch int, room uint64) {
	return int(id >> batchShift), id & (1<<batchShift - 1)
}

// BatchSeed is the sim model's seed for a batch, from the session's.
func BatchSeed(seed uint64, batch int) uint64 { return seed + uint64(batch) }

// StartGroupDecode is StartDecode for a decode instance that a CP group's
// ranks write into together: rooms complete once every owning rank reported
// (decode.Config.Group), each page is checked against the model's pattern
// of its batch, and onRoomEnd hears of every room's end.
// A room not complete within roomTimeout (if positive) fails; opts adjust
// the server's decode.Config last.
func StartGroupDecode(node *decode.Node, tr rdma.Transport, maxPoolBytes uint64, group decode.Group, roomTimeout time.Duration, id string,
	onRoomEnd func(decode.Room, error), log *zap.Logger, opts ...Option) (*Decode, error) {
	d := &Decode{tr: tr}
	cfg := decode.Config{
		ID:                 id,
		RoomTimeout:        roomTimeout,
		Size:               func(l []decode.PrefillBuffer) ([]decode.Buffer, error) { return d.size(l, maxPoolBytes) },
		Free:               d.free,
		AcceptUnknownRooms: true, // the router picks the instance; the rooms are the ranks' to announce
		Group:              &group,
		Verify:             d.verifyBatch,
		OnRoomEnd:          onRoomEnd,
		Log:                log,
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := decode.New(node, tr, cfg)
	if err != nil {
		return nil, err
	}
	d.Server = srv
	return d, nil
}

// verifyBatch is verify with the batch's seed and the batch's room.
func (d *Decode) verifyBatch(ss *decode.Session, c decode.Chunk) error {
	seed, err := strconv.ParseUint(ss.Metadata()[SeedKey], 10, 64)
	if err != nil {
		return errors.Newf("the prefill %s sent no sim seed (%s): its pages cannot be checked", ss.Prefill(), SeedKey)
	}
	batch, room := SplitRoom(c.Room)
	seed = BatchSeed(seed, batch)
	d.mu.Lock()
	defer d.mu.Unlock()
	want := make([]byte, d.pool.ItemLen)
	for i, pos := range c.Positions {
		for b := range d.pool.Layers {
			testbed.Fill(want, seed, room, b, pos)
			if !bytes.Equal(want, d.pool.Page(b, c.DstPages[i])) {
				msg := fmt.Sprintf("batch %d room %d position %d (decode page %d) buffer %s rank %d: bytes differ", batch, room, pos, c.DstPages[i], d.pool.Names[b], ss.Rank())
				if d.mismatch == "" {
					d.mismatch = msg
				}
				return errors.New(msg)
			}
			d.verified++
		}
	}
	return nil
}

// Verified returns the pages checked so far and the first mismatch ("").
func (d *Decode) Verified() (uint64, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.verified, d.mismatch
}

// LayoutOf is the prefill layout a session describes for geom.
func LayoutOf(geom testbed.Geometry) []system.Buffer {
	bufs := make([]system.Buffer, len(geom.Layers))
	for i := range bufs {
		bufs[i] = system.Buffer{Name: geom.Names[i], Layer: geom.Layers[i], ItemLen: geom.ItemLen, Pages: geom.Pages}
	}
	return bufs
}

// RankPlane is one CP rank's workload.DataPlane for one batch, over a
// session with a decode instance that outlives the batch: session returns
// the rank's session with the instance, dialling it (with the batch's
// geometry) only the first time.
type RankPlane struct {
	session      func(context.Context, testbed.Geometry) (*decode.Client, error)
	tr           rdma.Transport
	batch        int
	promptTokens int

	mu        sync.Mutex
	client    *decode.Client
	mismatch  string
	notices   int
	firstFail time.Time
}

// FirstFailure is when the first chunk of the batch did not succeed (zero
// if none): how soon the rank saw a loss.
func (p *RankPlane) FirstFailure() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.firstFail
}

var _ workload.DataPlane = (*RankPlane)(nil)

// NewRankPlane runs batch over the session that session returns; data
// goes over tr.
func NewRankPlane(session func(context.Context, testbed.Geometry) (*decode.Client, error), tr rdma.Transport, batch, promptTokens int) *RankPlane {
	return &RankPlane{session: session, tr: tr, batch: batch, promptTokens: promptTokens}
}

// Open returns the session's peer; opening the session ends with ctx.
func (p *RankPlane) Open(ctx context.Context, geom testbed.Geometry, _ uint64, _ *zap.Logger) (rdma.Transport, system.Peer, error) {
	c, err := p.session(ctx, geom)
	if err != nil {
		return nil, system.Peer{}, err
	}
	if err := c.Lost(); err != nil {
		return nil, system.Peer{}, err
	}
	p.mu.Lock()
	p.client = c
	p.mu.Unlock()
	return p.tr, c.Peer(), nil
}

func (p *RankPlane) get() *decode.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.client
}

// OnPeerLost fails the batch's engine when the decode instance is lost
// (the workload calls it after Open).
func (p *RankPlane) OnPeerLost(f func(error)) {
	if c := p.get(); c != nil {
		c.OnLost(f)
	}
}

// ChunkDone reports a chunk to the decode instance, unless this rank owns
// none of its pages and it succeeded: a rank outside a chunk's owners
// must not report it (the decode instance would fail the room).
func (p *RankPlane) ChunkDone(n workload.Notice) {
	if n.Status != system.Succeeded {
		p.mu.Lock()
		if p.firstFail.IsZero() {
			p.firstFail = time.Now()
		}
		p.mu.Unlock()
	}
	c := p.get()
	if c == nil || n.Status == system.Succeeded && len(n.Positions) == 0 || c.Lost() != nil {
		return
	}
	res := system.Result{Status: n.Status, Err: n.Err, Stats: system.ChunkStats{Bytes: n.Bytes}}
	res.Chunk.Room, res.Chunk.Start, res.Chunk.End = BatchRoom(p.batch, n.Room), n.Start, n.End
	err := c.Notify(context.Background(), decode.Notice{Result: res, Last: n.End >= p.promptTokens,
		Positions: n.Positions, DstPages: n.DstPages})
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notices++
	if err != nil && p.mismatch == "" {
		p.mismatch = err.Error()
	}
}

// Verify returns the decode instance's first refusal, or "".
func (p *RankPlane) Verify() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mismatch
}

// Close leaves the session open for the next batch.
func (p *RankPlane) Close() error { return nil }
