package reshardtest

import "github.com/kvstream/kvstream/cp"

// Side is one side's sharding, restated on purpose rather than taken from
// reshard.Side: the reference must not share the code it checks.
type Side struct {
	Layers, KVHeads, HeadDim, ElemBytes int
	MLA                                 bool
	TP                                  int
	Stages                              []int // nil: one stage
	PageSize                            int
	HeadMajor                           bool // [head][token][dim] pages, else [token][head][dim]
}

// Kinds is the buffers per layer: K and V, or the MLA latent.
func (s *Side) Kinds() int {
	if s.MLA {
		return 1
	}
	return 2
}

// PP is the number of pipeline stages.
func (s *Side) PP() int {
	if len(s.Stages) == 0 {
		return 1
	}
	return len(s.Stages) - 1
}

// StageLayers returns the layers [lo, hi) of stage st.
func (s *Side) StageLayers(st int) (lo, hi int) {
	if len(s.Stages) == 0 {
		return 0, s.Layers
	}
	return s.Stages[st], s.Stages[st+1]
}

// StageOf returns the stage that holds layer l.
func (s *Side) StageOf(l int) int {
	for st := 0; st+1 < len(s.Stages); st++ {
		if l < s.Stages[st+1] {
			return st
		}
	}
	return 0
}

// PerRank is the KV heads one TP rank holds.
func (s *Side) PerRank() int { return max(1, s.KVHeads/s.TP) }

// Holds reports whether TP rank tp holds head h.
func (s *Side) Holds(tp, h int) bool {
	rep := max(1, s.TP/s.KVHeads)
	lo := tp / rep * s.PerRank()
	return h >= lo && h < lo+s.PerRank()
}

// ItemLen is the bytes of one page of one buffer.
func (s *Side) ItemLen() int { return s.PageSize * s.PerRank() * s.HeadDim * s.ElemBytes }

// At is the byte offset of (page, token in page, head, byte) in a buffer of
// TP rank tp.
func (s *Side) At(tp, page, t, h, b int) int {
	hb := s.HeadDim * s.ElemBytes
	rep := max(1, s.TP/s.KVHeads)
	local := h - tp/rep*s.PerRank()
	if s.HeadMajor {
		return page*s.ItemLen() + (local*s.PageSize+t)*hb + b
	}
	return page*s.ItemLen() + (t*s.PerRank()+local)*hb + b
}

// Value is the KV byte of a logical element; never 0, so that a write that
// never happened cannot match by accident.
func Value(layer, kind, token, head, b int) byte {
	x := uint64(layer)<<48 ^ uint64(kind)<<44 ^ uint64(token)<<20 ^ uint64(head)<<8 ^ uint64(b)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return byte(1 + x%255)
}

// FillPage writes into page (one page of one buffer of TP rank tp) the
// logical bytes of request position pos for layer and kind, every head the
// rank holds: what a model's forward writes there.
func (s *Side) FillPage(page []byte, tp, layer, kind, pos int) {
	hb := s.HeadDim * s.ElemBytes
	for t := 0; t < s.PageSize; t++ {
		for h := 0; h < s.KVHeads; h++ {
			if !s.Holds(tp, h) {
				continue
			}
			for b := 0; b < hb; b++ {
				page[s.At(tp, 0, t, h, b)] = Value(layer, kind, pos*s.PageSize+t, h, b)
			}
		}
	}
}

// Owner is the CP rank that holds position p of a request of total pages,
// restated from the rules: shared-KV p % size, contiguous balanced slices.
func Owner(rule cp.Rule, size, total, p int) int {
	if rule == cp.SharedKV {
		return p % size
	}
	lo := 0
	for r := 0; r < size; r++ {
		n := total / size
		if r < total%size {
			n++
		}
		if p < lo+n {
			return r
		}
		lo += n
	}
	return -1
}

// Rank names one prefill rank's buffers.
type Rank struct{ Stage, TP, CP int }

// Bufs is one rank's buffers, indexed (layer - stage's first layer) *
// kinds + kind.
type Bufs [][]byte

// Request is one request on a pairing: both sides, how the prefill CP ranks
// hold its positions, and the page tables.
type Request struct {
	Prefill, Decode Side
	CPSize          int
	CPRule          cp.Rule
	Tokens          int
	SrcPool         int   // pages per prefill buffer
	SrcPages        []int // position -> prefill page, the same on every prefill rank
	DstPool         int   // pages per decode buffer
	DstPages        [][]int
	// DstPages: decode rank index (stage * decode TP + TP rank) -> position -> page.
}

// Pages is the request's page count.
func (r *Request) Pages() int { return (r.Tokens + r.Prefill.PageSize - 1) / r.Prefill.PageSize }

// Fill builds every prefill rank's buffers: its owned pages hold the
// request's KV, every other byte noise particular to the rank, so that a
// page sent by a CP rank that does not own it, or from the wrong buffer, is
// a wrong byte.
func (r *Request) Fill() map[Rank]Bufs {
	pre := &r.Prefill
	kinds, T := pre.Kinds(), r.Pages()
	out := map[Rank]Bufs{}
	for st := 0; st < pre.PP(); st++ {
		lo, hi := pre.StageLayers(st)
		for tp := 0; tp < pre.TP; tp++ {
			for c := 0; c < r.CPSize; c++ {
				bufs := make(Bufs, (hi-lo)*kinds)
				for i := range bufs {
					bufs[i] = make([]byte, r.SrcPool*pre.ItemLen())
					for j := range bufs[i] {
						bufs[i][j] = Value(1000+st, tp, c, i, j)
					}
					l, kind := lo+i/kinds, i%kinds
					for p := 0; p < T; p++ {
						if Owner(r.CPRule, r.CPSize, T, p) == c {
							off := r.SrcPages[p] * pre.ItemLen()
							pre.FillPage(bufs[i][off:off+pre.ItemLen()], tp, l, kind, p)
						}
					}
				}
				out[Rank{Stage: st, TP: tp, CP: c}] = bufs
			}
		}
	}
	return out
}

// Reference gathers the logical tensor from the prefill buffers (each
// element from its owning CP rank, its stage and the first TP rank that
// holds its head) and re-splits it into every decode rank's expected buffers
// (want, indexed like DstPages, then like Bufs); mask marks the bytes the
// request covers, every other byte of want is 0.
func (r *Request) Reference(src map[Rank]Bufs) (want []Bufs, mask [][][]bool) {
	pre, dec := &r.Prefill, &r.Decode
	kinds, T, P, H, hb := pre.Kinds(), r.Pages(), pre.PageSize, pre.KVHeads, pre.HeadDim*pre.ElemBytes
	L := pre.Layers
	logical := make([]byte, L*kinds*T*P*H*hb)
	idx := func(l, kind, tok, h, b int) int { return (((l*kinds+kind)*T*P+tok)*H+h)*hb + b }
	for l := 0; l < L; l++ {
		st := pre.StageOf(l)
		first, _ := pre.StageLayers(st)
		for kind := 0; kind < kinds; kind++ {
			for p := 0; p < T; p++ {
				c := Owner(r.CPRule, r.CPSize, T, p)
				for h := 0; h < H; h++ {
					tp := 0
					for !pre.Holds(tp, h) {
						tp++
					}
					buf := src[Rank{Stage: st, TP: tp, CP: c}][(l-first)*kinds+kind]
					for t := 0; t < P; t++ {
						for b := 0; b < hb; b++ {
							logical[idx(l, kind, p*P+t, h, b)] = buf[pre.At(tp, r.SrcPages[p], t, h, b)]
						}
					}
				}
			}
		}
	}
	for st := 0; st < dec.PP(); st++ {
		lo, hi := dec.StageLayers(st)
		for tp := 0; tp < dec.TP; tp++ {
			bufs := make(Bufs, (hi-lo)*kinds)
			m := make([][]bool, len(bufs))
			for i := range bufs {
				bufs[i] = make([]byte, r.DstPool*dec.ItemLen())
				m[i] = make([]bool, len(bufs[i]))
				l, kind := lo+i/kinds, i%kinds
				for p := 0; p < T; p++ {
					for t := 0; t < P; t++ {
						for h := 0; h < H; h++ {
							if !dec.Holds(tp, h) {
								continue
							}
							for b := 0; b < hb; b++ {
								at := dec.At(tp, r.DstPages[st*dec.TP+tp][p], t, h, b)
								bufs[i][at] = logical[idx(l, kind, p*P+t, h, b)]
								m[i][at] = true
							}
						}
					}
				}
			}
			want = append(want, bufs)
			mask = append(mask, m)
		}
	}
	return want, mask
}
