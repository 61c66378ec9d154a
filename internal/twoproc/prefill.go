package twoproc

import (
	"context"
	"strconv"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/internal/workload"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// Prefill is the sim workload's decode side when the decode is another
// process: a workload.DataPlane over a decode.Client. The session stays
// open after the run (Close does not end it) so that the command can say
// goodbye with the run's outcome (End).
type Prefill struct {
	node         *decode.Node
	dial         decode.DialConfig
	tr           rdma.Transport
	promptTokens int

	mu       sync.Mutex
	client   *decode.Client
	onLost   []func(error)
	mismatch string
	notices  int
}

var _ workload.DataPlane = (*Prefill)(nil)

// NewPrefill targets the decode process that dial names (its Decode
// address, and DecodeName with TLS) from node; data goes over tr.
// promptTokens is every request's length: a chunk ending there is its
// room's last.
func NewPrefill(node *decode.Node, dial decode.DialConfig, tr rdma.Transport, promptTokens int) *Prefill {
	return &Prefill{node: node, dial: dial, tr: tr, promptTokens: promptTokens}
}

// Open dials the decode process with the pool's layout and returns its peer.
func (p *Prefill) Open(geom testbed.Geometry, seed uint64, log *zap.Logger) (rdma.Transport, system.Peer, error) {
	cfg := p.dial
	cfg.Buffers, cfg.Metadata, cfg.Log = LayoutOf(geom), map[string]string{SeedKey: strconv.FormatUint(seed, 10)}, log
	c, err := decode.Dial(context.Background(), p.node, cfg)
	if err != nil {
		return nil, system.Peer{}, err
	}
	p.mu.Lock()
	p.client = c
	fs := p.onLost
	p.mu.Unlock()
	for _, f := range fs {
		c.OnLost(f)
	}
	return p.tr, c.Peer(), nil
}

// OnPeerLost sets what to do when the decode process is lost.
func (p *Prefill) OnPeerLost(f func(error)) {
	p.mu.Lock()
	c := p.client
	if c == nil {
		p.onLost = append(p.onLost, f)
	}
	p.mu.Unlock()
	if c != nil {
		c.OnLost(f)
	}
}

// Lost returns why the decode process was lost, or nil.
func (p *Prefill) Lost() error {
	if c := p.session(); c != nil {
		return c.Lost()
	}
	return nil
}

func (p *Prefill) session() *decode.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.client
}

// ChunkDone sends a finished chunk to the decode process, which verifies it.
func (p *Prefill) ChunkDone(n workload.Notice) {
	c := p.session()
	if c == nil || c.Lost() != nil {
		return
	}
	res := system.Result{Status: n.Status, Err: n.Err, Stats: system.ChunkStats{Bytes: n.Bytes}}
	res.Chunk.Room, res.Chunk.Start, res.Chunk.End = n.Room, n.Start, n.End
	err := c.Notify(context.Background(), decode.Notice{Result: res, Last: n.End >= p.promptTokens,
		Positions: n.Positions, DstPages: n.DstPages})
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notices++
	if err != nil && p.mismatch == "" && c.Lost() == nil {
		p.mismatch = err.Error()
	}
}

// Verify returns the decode process's first refusal or mismatch, or "".
func (p *Prefill) Verify(*testbed.Pool) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mismatch
}

// Close keeps the session open: End says goodbye with the run's outcome.
func (p *Prefill) Close() error { return nil }

// End says goodbye: aborted is nil when the run sent every chunk, else why
// it stopped. It returns the decode process's summary and its verdict.
func (p *Prefill) End(ctx context.Context, aborted error) (decode.Summary, error) {
	c := p.session()
	if c == nil {
		return decode.Summary{}, errors.New("no session: the run never opened one")
	}
	return c.Bye(ctx, aborted)
}
