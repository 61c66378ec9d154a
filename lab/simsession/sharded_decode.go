package simsession

import (
	"context"
	"fmt"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// MaxDecodeRanks bounds the decode ranks one sharded decode process
// serves (--decode-tp x --decode-pp): each is a server and a pool.
const MaxDecodeRanks = 256

// ShardedDecode is the sim's decode process for a sharded run: one
// decode.Server per decode (PP stage, TP rank) of its flags, all on one
// node and one transport, each its own pool and session. A rank admits a
// prefill only if the pairing it sends (ShardKey) agrees with the
// process's flags, sizes its pool from the DECODE side of that pairing
// (its stage's layers at the decode side's item length: what the
// prefill's Hello must describe), and checks every page of every
// successful chunk against the model's pattern for the heads and layers
// it holds.
type ShardedDecode struct {
	flags workload.Shard
	ranks []*decodeRank
}

// decodeRank is one rank's server, pool and check.
type decodeRank struct {
	rank   reshard.Rank
	server *decode.Server
	tr     rdma.Transport // allocates the pool where it can

	mu sync.Mutex
	// admitted is the decode side of the pairing Admit accepted last,
	// before the pool is sized; side, once sized, the pool's.
	admitted, side *reshard.Side
	pairing        workload.Shard
	pool           *testbed.Pool
	verified       uint64
	mismatch       string
}

// StartShardedDecode starts the servers of every decode rank that flags
// give (Model, both sides' TP and PP degrees, Order; Layers, PageSize and
// Scale are the prefill's) on node over tr; each rank's pool holds at most
// maxPoolBytes. prefills, when set, are the certificate names of the
// prefills served.
func StartShardedDecode(node *decode.Node, tr rdma.Transport, flags workload.Shard, maxPoolBytes uint64, prefills []string, log *zap.Logger, opts ...Option) (_ *ShardedDecode, err error) {
	if _, ok := workload.Presets[flags.Model]; !ok {
		return nil, errors.Mark(errors.Newf("--model %q: want one of %v", flags.Model, workload.PresetNames()), system.ErrBadInput)
	}
	tp, pp := max(1, flags.DecodeTP), max(1, flags.DecodePP)
	switch {
	case flags.PrefillTP < 0 || flags.DecodeTP < 0 || flags.PrefillPP < 0 || flags.DecodePP < 0:
		return nil, errors.Mark(errors.Newf("--prefill-tp %d --decode-tp %d --prefill-pp %d --decode-pp %d: must not be negative",
			flags.PrefillTP, flags.DecodeTP, flags.PrefillPP, flags.DecodePP), system.ErrBadInput)
	case tp > MaxDecodeRanks || pp > MaxDecodeRanks || tp*pp > MaxDecodeRanks:
		return nil, errors.Mark(errors.Newf("--decode-tp %d x --decode-pp %d: at most %d decode ranks in one process", tp, pp, MaxDecodeRanks), system.ErrBadInput)
	}
	d := &ShardedDecode{flags: flags}
	defer func() {
		if err != nil {
			_ = d.Close(context.Background())
		}
	}()
	for i := range tp * pp {
		r := &decodeRank{rank: reshard.Rank{TP: i % tp, Stage: i / tp}, tr: tr}
		cfg := decode.Config{
			Name:               RankServer(r.rank),
			ID:                 RankPeer(r.rank),
			Admit:              func(_ string, md map[string]string) error { return d.admit(r, md) },
			Size:               func(l []decode.PrefillBuffer) ([]decode.Buffer, error) { return r.size(l, maxPoolBytes) },
			Free:               r.free,
			MaxPoolBytes:       maxPoolBytes,
			Prefills:           prefills,
			AcceptUnknownRooms: true, // the sim's decode side does not schedule; it checks
			Verify:             r.verify,
			Log:                log,
		}
		for _, o := range opts {
			o(&cfg)
		}
		srv, err := decode.New(node, tr, cfg)
		if err != nil {
			return nil, errors.Wrapf(err, "decode PP stage %d TP rank %d", r.rank.Stage, r.rank.TP)
		}
		r.server = srv
		d.ranks = append(d.ranks, r)
	}
	return d, nil
}

// Servers are the ranks' servers, rank 0 first.
func (d *ShardedDecode) Servers() []*decode.Server {
	srvs := make([]*decode.Server, len(d.ranks))
	for i, r := range d.ranks {
		srvs[i] = r.server
	}
	return srvs
}

// Ranks is how many decode ranks the process serves.
func (d *ShardedDecode) Ranks() int { return len(d.ranks) }

// admit checks a Hello's pairing against the flags: a prefill that shards
// otherwise is refused with both values, before anything is sized.
func (d *ShardedDecode) admit(r *decodeRank, md map[string]string) error {
	text, ok := md[ShardKey]
	if _, tiny := md[TinyKey]; !ok && tiny {
		return d.refuse(errors.Newf("the prefill runs a tiny model, which runs unsharded across processes; this decode process serves %s: start it without --prefill-tp/--decode-tp/--prefill-pp/--decode-pp",
			flagsText(d.flags)))
	}
	if !ok {
		return d.refuse(errors.Newf("the prefill does not shard; this decode process serves %s: start the prefill with the same flags",
			flagsText(d.flags)))
	}
	pairing, err := ParseShard(text)
	if err != nil {
		return err
	}
	if msg := disagree(pairing, d.flags); msg != "" {
		return d.refuse(errors.Newf("%s: start both with the same sharding flags", msg))
	}
	_, dec, err := pairing.Sides()
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.side != nil {
		// Sized for an earlier session: a later one must write the same.
		if pairing != r.pairing {
			return errors.Newf("decode PP stage %d TP rank %d serves %s already, this prefill sends %s", r.rank.Stage, r.rank.TP, r.pairing, pairing)
		}
		return nil
	}
	r.admitted, r.pairing = &dec, pairing
	return nil
}

// refuse marks a disagreement. It reaches the prefill and the log; the
// process keeps serving, so that a prefill restarted with the right flags
// finds it (and so that no Hello can end it).
func (d *ShardedDecode) refuse(err error) error {
	return errors.Mark(err, system.ErrBadInput)
}

// flagsText spells the decode process's sharding flags.
func flagsText(f workload.Shard) string {
	return fmt.Sprintf("--model %s --prefill-tp %d --prefill-pp %d --decode-tp %d --decode-pp %d --page-order %s",
		f.Model, max(1, f.PrefillTP), max(1, f.PrefillPP), max(1, f.DecodeTP), max(1, f.DecodePP), f.Order)
}

// size allocates the rank's pool from the decode side the prefill's Hello
// was admitted for (decode.Config.Admit runs first): its stage's layers at
// the decode side's item length, as many pages as the Hello's layout
// (bounded by maxBytes). The layout must be exactly that pool.
func (r *decodeRank) size(layout []decode.PrefillBuffer, maxBytes uint64) ([]decode.Buffer, error) {
	r.mu.Lock()
	dec := r.admitted
	r.mu.Unlock()
	if dec == nil {
		return nil, errors.AssertionFailedf("decode rank %v sized before a pairing was admitted", r.rank)
	}
	pages := layout[0].Pages
	lo, hi := dec.StageLayers(r.rank.Stage)
	bufs := uint64((hi - lo) * dec.Kinds())
	if pages == 0 || pages > maxBytes/bufs/dec.ItemLen() {
		return nil, errors.Newf("decode PP stage %d TP rank %d: %d buffers of %d pages of %d bytes: more than --max-pool-mib allows (%d bytes)",
			r.rank.Stage, r.rank.TP, bufs, pages, dec.ItemLen(), maxBytes)
	}
	g := workload.RankGeometry(dec, r.rank.Stage, int(pages))
	if len(layout) != g.Buffers() {
		return nil, errors.Newf("decode PP stage %d TP rank %d: the prefill describes %d buffers, the pairing gives this rank %d (layers [%d, %d) x %d)",
			r.rank.Stage, r.rank.TP, len(layout), g.Buffers(), lo, hi, dec.Kinds())
	}
	for i, b := range layout {
		if b.ItemLen != g.ItemLen || b.Name != g.Names[i] || b.Layer != g.Layers[i] {
			return nil, errors.Newf("decode PP stage %d TP rank %d buffer %d: the prefill describes %.64s of layer %d, %d bytes a page; the pairing gives %s of layer %d, %d bytes a page",
				r.rank.Stage, r.rank.TP, i, b.Name, b.Layer, b.ItemLen, g.Names[i], g.Layers[i], g.ItemLen)
		}
	}
	pool, err := testbed.NewPoolOn(r.tr, g)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.side, r.pool = dec, pool
	r.mu.Unlock()
	return offerOf(pool), nil
}

// free takes back the rank's pool once its server holds it no more: the
// next prefill may pair otherwise.
func (r *decodeRank) free([]decode.Buffer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pool != nil {
		_ = r.pool.Free()
	}
	r.pool, r.side, r.admitted = nil, nil, nil
}

// verify checks every page a successful chunk wrote into this rank: each
// buffer's page holds the pattern of this rank's heads of its layer.
func (r *decodeRank) verify(ss *decode.Session, c decode.Chunk) error {
	seed, err := seedOf(ss)
	if err != nil {
		return err
	}
	return r.check(seed, c)
}

// check is verify with the session's seed.
func (r *decodeRank) check(seed uint64, c decode.Chunk) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return checkChunk(r.pool, c, &r.verified, &r.mismatch,
		func(want []byte, b, pos int) {
			layer, kind := workload.LayerKind(r.side, r.rank.Stage, b)
			workload.PageFill(want, r.side, r.rank.TP, seed, c.Room, layer, kind, pos)
		},
		func(pos, page int, buffer string) string {
			return fmt.Sprintf("decode TP rank %d (PP stage %d) room %d position %d (decode page %d) buffer %s: bytes differ from the rank's heads",
				r.rank.TP, r.rank.Stage, c.Room, pos, page, buffer)
		})
}

// Serve serves prefill runs (one session per decode rank each) until ctx
// ends or cfg.Runs of them did something, then drains; the caller
// closes. A prefill whose pairing disagrees with the flags is refused and
// serving goes on.
func (d *ShardedDecode) Serve(ctx context.Context, cfg ServeConfig) DecodeSummary {
	return serve(ctx, d.Servers(), cfg, d.verified)
}

// verified adds up the ranks' checked pages; the first mismatch.
func (d *ShardedDecode) verified() (uint64, string) {
	var pages uint64
	mismatch := ""
	for _, r := range d.ranks {
		r.mu.Lock()
		pages += r.verified
		if mismatch == "" {
			mismatch = r.mismatch
		}
		r.mu.Unlock()
	}
	return pages, mismatch
}

// Close closes every rank's server, each of which frees its pool once no
// prefill can write it (see Decode.Close).
func (d *ShardedDecode) Close(ctx context.Context) error {
	var err error
	for _, r := range d.ranks {
		err = errors.CombineErrors(err, r.server.Close(ctx))
	}
	return err
}
