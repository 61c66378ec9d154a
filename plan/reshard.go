package plan

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
)

// Sharding is how one side (the prefill engine, or a decode peer) shards the
// model's KV cache, and which of that side's ranks it is. With a sharding on
// both sides a peer receives what cp/reshard routes from this prefill rank to
// that decode rank (head slices, layer subsets, MLA copies); without, it
// receives this rank's buffers one for one, whole pages (identical
// sharding).
type Sharding struct {
	Side reshard.Side
	Rank reshard.Rank
}

// Route is how one resharded peer receives this prefill rank's buffers: the
// pairing's route to it and, per buffer of the layout, the peer buffer it
// feeds. It is computed once, when the peer is added, and shared read-only
// by every chunk.
type Route struct {
	*reshard.Route
	// DstBuffers holds, per prefill buffer, the index of the peer buffer it
	// feeds, or -1 when its layer does not go to this peer.
	DstBuffers []int
}

// Sends reports whether any of bufs goes to the peer.
func (r *Route) Sends(bufs []int) bool {
	for _, b := range bufs {
		if r.DstBuffers[b] >= 0 {
			return true
		}
	}
	return false
}

// SetSharding gives the layout its side of a resharding pairing: the
// prefill side and this rank, and which replica sends replicated heads. It
// checks the buffers against the side: this stage's layers times K and V
// (or the MLA latent), each of Side.ItemLen bytes per page; a buffer's
// Layer is its layer within the stage (the hookless MTP layer included) and
// the buffers of one layer are K, then V, in list order (as KVBuffers makes
// them). Call it once, before the layout is shared.
func (l *Layout) SetSharding(s *Sharding, rule reshard.ReplicaRule) error {
	side := &s.Side
	if err := side.Validate("prefill"); err != nil {
		return err
	}
	if err := side.ValidateRank("prefill", s.Rank); err != nil {
		return err
	}
	if side.PageSize != l.PageSize {
		return badInput("prefill sharding: page size %d, the layout's %d", side.PageSize, l.PageSize)
	}
	lo, hi := side.StageLayers(s.Rank.Stage)
	n, kinds := hi-lo, side.Kinds()
	if len(l.Buffers) != n*kinds {
		return badInput("prefill sharding: %d buffers, PP stage %d holds %d layers x %d buffers", len(l.Buffers), s.Rank.Stage, n, kinds)
	}
	idx := make([]int, len(l.Buffers))
	seen := make([]int, n)
	for i, b := range l.Buffers {
		switch {
		case b.Layer < 0 || b.Layer >= n:
			return badInput("buffer %d (%s): layer %d outside PP stage %d's %d layers", i, b.Name, b.Layer, s.Rank.Stage, n)
		case seen[b.Layer] == kinds:
			return badInput("buffer %d (%s): layer %d has more than %d buffers", i, b.Name, b.Layer, kinds)
		case b.ItemLen != side.ItemLen():
			return badInput("buffer %d (%s): item length %d, the prefill sharding gives %d (page %d x %d heads x %d bytes)",
				i, b.Name, b.ItemLen, side.ItemLen(), side.PageSize, side.ItemLen()/uint64(side.PageSize)/side.HeadBytes(), side.HeadBytes())
		}
		idx[i] = b.Layer*kinds + seen[b.Layer]
		seen[b.Layer]++
	}
	c := *s
	c.Side.Stages = append([]int(nil), s.Side.Stages...)
	l.sharding, l.replicas, l.reshardIdx = &c, rule, idx
	return nil
}

// Sharding returns the layout's prefill sharding, or nil.
func (l *Layout) Sharding() *Sharding { return l.sharding }

// resolveRoute computes a resharded peer's route from this layout's rank.
func (l *Layout) resolveRoute(p *Peer) (*Route, error) {
	if l.sharding == nil {
		return nil, badInput("peer %q gives its sharding (TP %d rank %d), the engine none: set the prefill side's too", p.ID, p.Sharding.Side.TP, p.Sharding.Rank.TP)
	}
	dec := &p.Sharding.Side
	pair := reshard.Pairing{Prefill: l.sharding.Side, Decode: *dec, Replicas: l.replicas}
	rp, err := reshard.NewPlan(&pair, l.sharding.Rank)
	if err != nil {
		return nil, errors.Wrapf(err, "peer %q", p.ID)
	}
	if err := dec.ValidateRank("decode", p.Sharding.Rank); err != nil {
		return nil, errors.Wrapf(err, "peer %q", p.ID)
	}
	lo, hi := dec.StageLayers(p.Sharding.Rank.Stage)
	n, kinds := hi-lo, dec.Kinds()
	if len(p.Buffers) != n*kinds {
		return nil, badInput("peer %q has %d buffers, its PP stage %d holds %d layers x %d buffers", p.ID, len(p.Buffers), p.Sharding.Rank.Stage, n, kinds)
	}
	for i, b := range p.Buffers {
		switch {
		case b.ItemLen != dec.ItemLen():
			return nil, badInput("peer %q buffer %d: item length %d, its sharding gives %d", p.ID, i, b.ItemLen, dec.ItemLen())
		case b.Region.Len < b.ItemLen:
			return nil, badInput("peer %q buffer %d: region of %d bytes holds no page", p.ID, i, b.Region.Len)
		}
	}
	r := &Route{Route: rp.Route(p.Sharding.Rank), DstBuffers: make([]int, len(l.Buffers))}
	for i, si := range l.reshardIdx {
		d, ok := r.DstBuffer(si)
		if !ok {
			r.DstBuffers[i] = -1
			continue
		}
		// The peer lists its buffers as KVBuffers does: every layer's K,
		// then every layer's V.
		r.DstBuffers[i] = d%kinds*n + d/kinds
	}
	return r, nil
}
