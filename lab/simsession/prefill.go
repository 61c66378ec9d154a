package simsession

import (
	"context"
	"slices"
	"strconv"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// Prefill is the sim workload's decode side when the decode is another
// process: a workload.DataPlane over a decode.Client, or, for a sharded
// run, a workload.ShardedPlane over one decode.Client per decode rank. The
// sessions stay open after the run (Close does not end them) so that the
// command can say goodbye with the run's outcome (End).
type Prefill struct {
	node         *decode.Node
	dial         decode.DialConfig
	tr           rdma.Transport
	promptTokens int

	mu       sync.Mutex
	clients  []*decode.Client // one per decode rank (one unsharded)
	onLost   []func(error)
	mismatch string // the decode's first rejection of a chunk (ErrChunkFailed)
	refused  string // its first refusal of a notice for another reason
	onDrain  []func(string)
	notices  int
	accepted int
	// unanswered counts notices a live decode process did not answer
	// within the call timeout (decode.ErrUnreachable): not a verdict on
	// the bytes; its answer to Bye is (see Unanswered).
	unanswered int
}

var (
	_ workload.DataPlane    = (*Prefill)(nil)
	_ workload.ShardedPlane = (*Prefill)(nil)
)

// NewPrefill targets the decode process that dial names (its Decode
// address, and DecodeName with TLS) from node; data goes over tr.
// promptTokens is every request's length: a chunk ending there is its
// room's last.
func NewPrefill(node *decode.Node, dial decode.DialConfig, tr rdma.Transport, promptTokens int) *Prefill {
	return &Prefill{node: node, dial: dial, tr: tr, promptTokens: promptTokens}
}

// Open dials the decode process with the pool's layout and returns its
// peer; the dial ends with ctx.
func (p *Prefill) Open(ctx context.Context, geom testbed.Geometry, seed uint64, log *zap.Logger) (rdma.Transport, system.Peer, error) {
	cfg := p.dial
	cfg.Buffers, cfg.Metadata, cfg.Log = LayoutOf(geom), map[string]string{SeedKey: strconv.FormatUint(seed, 10)}, log
	c, err := p.open(ctx, cfg)
	if err != nil {
		return nil, system.Peer{}, err
	}
	return p.tr, c.Peer(), nil
}

// OpenSharded opens a session with every decode rank of the decode
// process, rank 0 first (a decode process that disagrees on the pairing
// names the difference there): each Hello describes the rank's pool as
// the pairing gives it, and carries the pairing (ShardKey) for the decode
// process to check against its own flags.
func (p *Prefill) OpenSharded(ctx context.Context, shard workload.Shard, ranks []workload.DecodeRank, seed uint64, log *zap.Logger) (rdma.Transport, []system.Peer, error) {
	var peers []system.Peer
	for _, r := range ranks {
		cfg := p.dial
		cfg.Server, cfg.Buffers, cfg.Log = RankServer(r.Rank), LayoutOf(r.Geometry), log
		cfg.Metadata = map[string]string{SeedKey: strconv.FormatUint(seed, 10), ShardKey: FormatShard(shard)}
		c, err := p.open(ctx, cfg)
		if err != nil {
			return nil, nil, errors.Wrapf(err, "decode PP stage %d TP rank %d", r.Rank.Stage, r.Rank.TP)
		}
		if want := RankPeer(r.Rank); c.Peer().ID != want {
			return nil, nil, errors.Newf("decode PP stage %d TP rank %d: its server's peer id is %q, want %q", r.Rank.Stage, r.Rank.TP, c.Peer().ID, want)
		}
		peers = append(peers, c.Peer())
	}
	return p.tr, peers, nil
}

// open dials one session and keeps it, with the loss hooks set so far.
// The dial ends with ctx: a decode process that never answers keeps a
// dial waiting for as long as DialConfig.ConnectTimeout allows, which a
// second signal must cut.
func (p *Prefill) open(ctx context.Context, cfg decode.DialConfig) (*decode.Client, error) {
	c, err := decode.Dial(ctx, p.node, cfg)
	if err != nil {
		if ctx.Err() == nil && (errors.Is(err, decode.ErrUnreachable) || errors.Is(err, decode.ErrUnavailable)) {
			// What gave up is the command's flag.
			return nil, errors.Wrapf(err, "no decode process at %s within --connect-timeout %v", cfg.Decode, cfg.ConnectTimeout)
		}
		return nil, err
	}
	p.mu.Lock()
	p.clients = append(p.clients, c)
	fs, ds := p.onLost, p.onDrain
	p.mu.Unlock()
	for _, f := range fs {
		c.OnLost(f)
	}
	for _, f := range ds {
		c.OnDrain(f)
	}
	return c, nil
}

// OnDrain sets what to do when the decode process (any of its ranks'
// servers) says it drains: it is stopping, and takes no new request.
func (p *Prefill) OnDrain(f func(reason string)) {
	p.mu.Lock()
	p.onDrain = append(p.onDrain, f)
	cs := slices.Clone(p.clients)
	p.mu.Unlock()
	for _, c := range cs {
		c.OnDrain(f)
	}
}

// Draining returns why the decode process drains, or "".
func (p *Prefill) Draining() string {
	for _, c := range p.sessions() {
		if d := c.Draining(); d != "" {
			return d
		}
	}
	return ""
}

// OnPeerLost sets what to do when the decode process (any of its ranks'
// sessions) is lost.
func (p *Prefill) OnPeerLost(f func(error)) {
	p.mu.Lock()
	p.onLost = append(p.onLost, f)
	cs := slices.Clone(p.clients)
	p.mu.Unlock()
	for _, c := range cs {
		c.OnLost(f)
	}
}

// Lost returns why the decode process was lost, or nil.
func (p *Prefill) Lost() error {
	for _, c := range p.sessions() {
		if err := c.Lost(); err != nil {
			return err
		}
	}
	return nil
}

// Ready is nil while the prefill has its sessions with the decode
// process and none was lost: what /readyz of kvstream prefill reports.
func (p *Prefill) Ready() error {
	if len(p.sessions()) == 0 {
		return errors.New("no session with the decode process yet")
	}
	if err := p.Lost(); err != nil {
		return errors.Wrap(err, "the decode process was lost")
	}
	return nil
}

// Accepted counts the chunk notices the decode process (each rank)
// accepted: what it verified, also when the session ends without a Bye.
func (p *Prefill) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *Prefill) sessions() []*decode.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.clients)
}

// ChunkDone sends a finished chunk to the decode process, every decode
// rank of it, which verifies it.
func (p *Prefill) ChunkDone(n workload.Notice) {
	res := system.Result{Status: n.Status, Err: n.Err, Stats: system.ChunkStats{Bytes: n.Bytes}}
	res.Chunk.Room, res.Chunk.Start, res.Chunk.End = n.Room, n.Start, n.End
	for _, c := range p.sessions() {
		if c.Lost() != nil {
			return
		}
		err := c.Notify(context.Background(), decode.Notice{Result: res, Last: n.End >= p.promptTokens,
			Positions: n.Positions, DstPages: n.DstPages})
		p.mu.Lock()
		p.notices++
		if err == nil {
			p.accepted++
		}
		switch {
		case err == nil || c.Lost() != nil:
		case errors.Is(err, decode.ErrUnreachable):
			p.unanswered++
		case errors.Is(err, decode.ErrChunkFailed):
			if p.mismatch == "" {
				p.mismatch = err.Error()
			}
		case p.refused == "":
			// Refused without a look at the bytes (the session ended, the
			// decode is closing): no verdict on them.
			p.refused = err.Error()
		}
		p.mu.Unlock()
	}
}

// Unanswered counts the notices the decode process did not answer in time
// while its session stayed up. The bytes of those chunks are equal only if
// its answer to Bye says every room complete and no chunk failed.
func (p *Prefill) Unanswered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unanswered
}

// LateSettled reports whether the notices the decode process answered late
// (Unanswered) are settled by its goodbye: there were none, or the run was
// not cut short (aborted nil) and the goodbye's answer (sum, byeErr) says
// every room complete and no chunk failed. A late answer is no verdict on
// the bytes; only the goodbye is.
func (p *Prefill) LateSettled(sum decode.Summary, byeErr, aborted error) bool {
	return p.Unanswered() == 0 || aborted == nil && byeErr == nil && sum.Failed == 0
}

// Verify returns the decode process's first rejection of a chunk it was
// told of (its bytes differ, or the chunk failed its room), or "".
func (p *Prefill) Verify() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mismatch
}

// Refused returns the decode process's first refusal of a notice for
// another reason than the chunk (the session ended, the server is
// closing), or "": the chunk's bytes were not compared.
func (p *Prefill) Refused() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Close keeps the sessions open: End says goodbye with the run's outcome.
func (p *Prefill) Close() error { return nil }

// End says goodbye on every session: aborted is nil when the run sent
// every chunk, else why it stopped. It returns the decode process's
// summary (every rank's counts added up) and its verdict (the first
// rank's that is not complete).
func (p *Prefill) End(ctx context.Context, aborted error) (decode.Summary, error) {
	cs := p.sessions()
	if len(cs) == 0 {
		return decode.Summary{}, errors.New("no session: the run never opened one")
	}
	var sum decode.Summary
	var first error
	for _, c := range cs {
		s, err := c.Bye(ctx, aborted)
		sum.Chunks += s.Chunks
		sum.Failed += s.Failed
		if err != nil && first == nil {
			first = err
		}
	}
	return sum, first
}
