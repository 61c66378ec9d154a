package reshard

import "github.com/kvstream/kvstream/cp"

// Piece is a strided set of Count equal writes within one page: write i
// copies Len bytes from Src + i*SrcStride to Dst + i*DstStride, where Src is
// an offset in a page of the prefill buffer and Dst one in a page of the
// decode buffer. A head slice of a token-major page is one Piece of
// page_size writes; of a head-major page, one write.
type Piece struct {
	Src, Dst, Len        uint64
	Count                int
	SrcStride, DstStride uint64
}

// Route is what one prefill rank sends to one decode rank, identical for
// every page and for every K, V or latent buffer of the layers it covers.
type Route struct {
	Dest Rank
	// LayerLo, LayerHi are the model layers sent: the intersection of the
	// prefill stage's layers and the decode stage's.
	LayerLo, LayerHi int
	// HeadLo, HeadHi are the logical KV heads sent (0, 1 with MLA).
	HeadLo, HeadHi int
	// SrcItem, DstItem are the bytes of one page of one buffer on each side.
	SrcItem, DstItem uint64
	// Pieces are the writes within one page, in increasing offsets, each as
	// wide as contiguity on both sides allows.
	Pieces []Piece
	// Whole: the route copies whole pages, so a run of pages is one write.
	Whole bool
	// PageJoin: the last write of a page ends both items and the first write
	// of a page starts both, so within a run (pages consecutive on both
	// sides) a page's last write and the next page's first are one write.
	// It happens when the orders differ but the route covers every head of
	// both ranks.
	PageJoin bool

	kinds              int
	srcFirst, dstFirst int // first layer of the prefill and the decode stage
}

// Empty reports whether the route sends nothing.
func (r *Route) Empty() bool { return r.LayerLo >= r.LayerHi || len(r.Pieces) == 0 }

// PageBytes is the bytes the route sends per page per buffer.
func (r *Route) PageBytes() uint64 {
	var n uint64
	for _, p := range r.Pieces {
		n += p.Len * uint64(p.Count)
	}
	return n
}

// DstBuffer maps a prefill buffer of this rank to the decode buffer it
// feeds. Buffers are numbered per stage as (layer - first layer) * kinds +
// kind, with K before V; ok is false when the buffer's layer does not go to
// this destination.
func (r *Route) DstBuffer(srcBuf int) (dstBuf int, ok bool) {
	if srcBuf < 0 || r.kinds == 0 {
		return 0, false
	}
	l := r.srcFirst + srcBuf/r.kinds
	if l < r.LayerLo || l >= r.LayerHi {
		return 0, false
	}
	return (l-r.dstFirst)*r.kinds + srcBuf%r.kinds, true
}

// Blocks is how many writes AppendBlocks makes for runs, to size a batch.
func (r *Route) Blocks(runs []cp.Run) int {
	if r.Whole {
		return len(runs)
	}
	per := 0
	for _, p := range r.Pieces {
		per += p.Count
	}
	n := per * cp.Pages(runs)
	if r.PageJoin {
		n -= cp.Pages(runs) - len(runs)
	}
	return n
}

// AppendBlocks appends one buffer's writes for runs and returns the extended
// slice; srcBase and dstBase are the addresses of page 0 of the prefill
// buffer and of the decode buffer it feeds. A whole-page route makes one
// write per run, like cp.AppendBlocks; otherwise every page of a run makes
// its pieces' writes, joined across pages when PageJoin. It allocates only
// to grow bs, so a submitter that reuses its slice builds a group's batch
// without allocating.
func (r *Route) AppendBlocks(bs []cp.Block, runs []cp.Run, srcBase, dstBase uint64) []cp.Block {
	if r.Whole {
		return cp.AppendBlocks(bs, runs, srcBase, dstBase, r.SrcItem)
	}
	if len(r.Pieces) == 1 && r.Pieces[0].Count == 1 {
		// One write per page (a head slice of a head-major page): the common
		// case when the sides shard differently, kept to a tight loop.
		p := r.Pieces[0]
		for _, run := range runs {
			src := srcBase + uint64(run.Src)*r.SrcItem + p.Src
			dst := dstBase + uint64(run.Dst)*r.DstItem + p.Dst
			for range run.Len {
				bs = append(bs, cp.Block{Src: src, Dst: dst, Len: p.Len})
				src += r.SrcItem
				dst += r.DstItem
			}
		}
		return bs
	}
	for _, run := range runs {
		src := srcBase + uint64(run.Src)*r.SrcItem
		dst := dstBase + uint64(run.Dst)*r.DstItem
		for k := range int(run.Len) {
			for j, p := range r.Pieces {
				s, d := src+p.Src, dst+p.Dst
				i := 0
				if k > 0 && j == 0 && r.PageJoin {
					// The previous page's last write ends where this one starts.
					bs[len(bs)-1].Len += p.Len
					s, d, i = s+p.SrcStride, d+p.DstStride, 1
				}
				for ; i < p.Count; i++ {
					bs = append(bs, cp.Block{Src: s, Dst: d, Len: p.Len})
					s += p.SrcStride
					d += p.DstStride
				}
			}
			src += r.SrcItem
			dst += r.DstItem
		}
	}
	return bs
}

// Plan is everything one prefill rank sends to every decode rank of a
// pairing. It depends on the pairing only, not on a request: it is computed
// once, when the decode peer is added, and every chunk reuses it with its
// own runs.
type Plan struct {
	Src Rank
	// Routes holds one route per decode rank, at index Stage*TP + TP rank of
	// the decode side; most are empty when the sides shard alike.
	Routes []Route

	decodeTP int
}

// Route returns the route to decode rank d, or nil when d is not a rank of
// the decode side.
func (p *Plan) Route(d Rank) *Route {
	i := d.Stage*p.decodeTP + d.TP
	if d.TP < 0 || d.TP >= p.decodeTP || d.Stage < 0 || i >= len(p.Routes) {
		return nil
	}
	return &p.Routes[i]
}

// NewPlan validates the pairing and computes what prefill rank src sends to
// each decode rank:
//   - layers: the intersection of src's PP stage and the decode stage;
//   - heads: the intersection of the heads src holds and those the decode
//     rank holds, sent only if src is the replica the ReplicaRule chooses
//     for that decode rank, so that every destination byte has exactly one
//     sender (the MLA latent is the one head every rank holds);
//   - bytes: the pieces of a page that carry those heads, coalesced.
func NewPlan(p *Pairing, src Rank) (*Plan, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	pre, dec := &p.Prefill, &p.Decode
	if err := pre.ValidateRank("prefill", src); err != nil {
		return nil, err
	}
	_, repP := pre.heads()
	replica := src.TP % repP
	srcLo, srcHi := pre.StageLayers(src.Stage)
	hpLo, hpHi := pre.RankHeads(src.TP)
	sg := geom{order: pre.Order, page: pre.PageSize, hb: pre.HeadBytes(), first: hpLo}
	sg.heads = hpHi - hpLo

	plan := &Plan{Src: src, Routes: make([]Route, dec.PP()*dec.TP), decodeTP: dec.TP}
	for st := 0; st < dec.PP(); st++ {
		dLo, dHi := dec.StageLayers(st)
		lo, hi := max(srcLo, dLo), min(srcHi, dHi)
		for d := 0; d < dec.TP; d++ {
			r := &plan.Routes[st*dec.TP+d]
			r.Dest = Rank{TP: d, Stage: st}
			chosen := 0
			if p.Replicas == SpreadReplicas {
				chosen = d % repP
			}
			hdLo, hdHi := dec.RankHeads(d)
			hLo, hHi := max(hpLo, hdLo), min(hpHi, hdHi)
			if lo >= hi || hLo >= hHi || replica != chosen {
				continue
			}
			dg := geom{order: dec.Order, page: dec.PageSize, heads: hdHi - hdLo, hb: dec.HeadBytes(), first: hdLo}
			*r = Route{
				Dest: r.Dest, LayerLo: lo, LayerHi: hi, HeadLo: hLo, HeadHi: hHi,
				SrcItem: pre.ItemLen(), DstItem: dec.ItemLen(),
				Pieces: pieces(sg, dg, hLo, hHi),
				kinds:  pre.Kinds(), srcFirst: srcLo, dstFirst: dLo,
			}
			first, last := r.Pieces[0], r.Pieces[len(r.Pieces)-1]
			n := uint64(last.Count - 1)
			starts := first.Src == 0 && first.Dst == 0
			ends := last.Src+n*last.SrcStride+last.Len == r.SrcItem && last.Dst+n*last.DstStride+last.Len == r.DstItem
			r.Whole = starts && ends && len(r.Pieces) == 1 && last.Count == 1
			r.PageJoin = starts && ends && !r.Whole
		}
	}
	return plan, nil
}

// geom is one side's page geometry for one rank.
type geom struct {
	order       Order
	page, heads int    // tokens per page, heads the rank holds
	hb          uint64 // bytes of one head of one token
	first       int    // the rank's first logical head
}

// offset is where token t of logical head h starts within a page.
func (g geom) offset(t, h int) uint64 {
	h -= g.first
	if g.order == HeadMajor {
		return (uint64(h)*uint64(g.page) + uint64(t)) * g.hb
	}
	return (uint64(t)*uint64(g.heads) + uint64(h)) * g.hb
}

// tokenStride is the distance between one head's consecutive tokens.
func (g geom) tokenStride() uint64 {
	if g.order == HeadMajor {
		return g.hb
	}
	return uint64(g.heads) * g.hb
}

// pieces returns the writes that copy logical heads [lo, hi) of one page,
// merged wherever both sides are contiguous.
func pieces(s, d geom, lo, hi int) []Piece {
	var ps []Piece
	switch {
	case s.order == HeadMajor && d.order == HeadMajor:
		// Heads [lo, hi) are one contiguous span of every token on both sides.
		ps = []Piece{{Src: s.offset(0, lo), Dst: d.offset(0, lo), Len: uint64(hi-lo) * uint64(s.page) * s.hb, Count: 1}}
	case s.order == TokenMajor && d.order == TokenMajor:
		// One slice per token, strided by each side's heads per token.
		ps = []Piece{{Src: s.offset(0, lo), Dst: d.offset(0, lo), Len: uint64(hi-lo) * s.hb,
			Count: s.page, SrcStride: s.tokenStride(), DstStride: d.tokenStride()}}
	default:
		// The orders differ: each head's tokens are strided on one side and
		// contiguous on the other.
		ps = make([]Piece, 0, hi-lo)
		for h := lo; h < hi; h++ {
			ps = append(ps, Piece{Src: s.offset(0, h), Dst: d.offset(0, h), Len: s.hb,
				Count: s.page, SrcStride: s.tokenStride(), DstStride: d.tokenStride()})
		}
	}
	out := ps[:0]
	for _, p := range ps {
		p = normalize(p)
		if n := len(out); n > 0 {
			q := &out[n-1]
			if q.Count == p.Count && q.SrcStride == p.SrcStride && q.DstStride == p.DstStride &&
				q.Src+q.Len == p.Src && q.Dst+q.Len == p.Dst {
				q.Len += p.Len
				*q = normalize(*q)
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

// normalize turns a strided piece whose writes abut on both sides into one
// write, and gives a single write zero strides.
func normalize(p Piece) Piece {
	if p.Count > 1 && p.SrcStride == p.Len && p.DstStride == p.Len {
		p.Len *= uint64(p.Count)
		p.Count = 1
	}
	if p.Count == 1 {
		p.SrcStride, p.DstStride = 0, 0
	}
	return p
}
