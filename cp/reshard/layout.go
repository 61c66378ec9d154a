package reshard

import (
	"strconv"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
)

// ErrBadInput marks every error of this package; it is cp.ErrBadInput, so a
// caller branches on one class for all the pure arithmetic.
var ErrBadInput = cp.ErrBadInput

func badInput(format string, args ...any) error {
	return errors.Mark(errors.Newf(format, args...), ErrBadInput)
}

// Order is how one page of one layer's K (or V) buffer is laid out.
type Order int

const (
	// TokenMajor is [page][token][head][dim]: the layout of SGLang's and
	// vLLM's default paged KV (per layer a K buffer of shape [num_pages,
	// page_size, heads, head_dim]). A subset of a page's heads is then
	// page_size strided pieces, one per token.
	TokenMajor Order = iota
	// HeadMajor is [page][head][token][dim] (the layout vLLM calls "HND"):
	// a subset of a page's heads is one contiguous piece.
	HeadMajor
)

// String returns the order's flag spelling.
func (o Order) String() string {
	switch o {
	case TokenMajor:
		return "token-major"
	case HeadMajor:
		return "head-major"
	}
	return "Order(" + strconv.Itoa(int(o)) + ")"
}

// ReplicaRule chooses which of the prefill ranks that hold the same KV
// heads (GQA with TP above the KV head count, and the MLA latent, which every
// rank holds) sends them to a given decode rank. Either way exactly one
// replica sends each destination's copy.
type ReplicaRule int

const (
	// SpreadReplicas: decode TP rank d receives from replica d % replicas,
	// which spreads the copies over the replicas (and, with equal TP on both
	// sides, maps every rank to the rank of the same index).
	SpreadReplicas ReplicaRule = iota
	// FirstReplica: replica 0 sends every copy, leaving the other replicas'
	// links free.
	FirstReplica
)

// Limits far above any model; they keep every size computation within
// int64 (page bytes at most 2^16 tokens * 2^12 heads * 2^20 bytes = 2^48).
const (
	MaxLayers    = 1 << 12
	MaxHeads     = 1 << 12
	MaxHeadBytes = 1 << 20
	MaxPageSize  = 1 << 16
	MaxTP        = 1 << 10
)

// Side is how one side (the prefill pool or the decode pool) shards the
// model's KV cache. Both sides must describe the same model; they may differ
// in TP degree, PP stages and page order.
type Side struct {
	// Layers is the model's number of KV layers (every layer that owns a
	// buffer, an MTP/nextn draft layer included).
	Layers int
	// KVHeads is the model's number of KV heads; 1 with MLA (the latent).
	KVHeads int
	// HeadDim is the elements of one head of one token; with MLA the
	// latent's width (kv_lora_rank + rope dim).
	HeadDim int
	// ElemBytes is the bytes of one element (the dtype: 2 for bf16).
	ElemBytes int
	// MLA: one latent buffer per layer, replicated on every TP rank.
	// Otherwise (MHA/GQA) a K and a V buffer per layer.
	MLA bool
	// TP is the tensor-parallel degree. With MHA/GQA the KV heads split
	// evenly over the ranks, or, when TP exceeds them, every head is
	// replicated on TP/KVHeads ranks.
	TP int
	// HeadsPerRank, when not 0, is checked against the heads a rank must
	// hold (KVHeads/TP, at least 1): the engine's buffer geometry must agree
	// with the sharding.
	HeadsPerRank int
	// Stages are the PP stage boundaries: stage s holds layers
	// [Stages[s], Stages[s+1]). Nil means one stage holding every layer.
	Stages []int
	// PageSize is tokens per page; both sides must use the same, because a
	// request position maps to a destination page one to one.
	PageSize int
	// Order is the page layout of every K/V buffer on this side.
	Order Order
}

// Rank is one rank of a side: its TP rank and PP stage.
type Rank struct {
	TP, Stage int
}

// Kinds is the number of buffers per layer: K and V, or the MLA latent.
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

// SplitStages splits layers into pp stages of sizes differing by at most
// one, as Side.Stages (nil: one stage, for pp 0 or 1). It refuses, before
// allocating anything, a negative pp, layers outside [1, MaxLayers] and
// more stages than layers (a stage holds at least one layer): pp sizes
// the list, and may come from a flag or the network.
func SplitStages(layers, pp int) ([]int, error) {
	switch {
	case pp < 0:
		return nil, badInput("PP %d: must not be negative", pp)
	case layers < 1 || layers > MaxLayers:
		return nil, badInput("PP %d over %d layers: the layers must be in [1, %d]", pp, layers, MaxLayers)
	case pp > layers:
		return nil, badInput("PP %d: more stages than the %d layers (each stage holds at least one)", pp, layers)
	}
	return EvenStages(layers, pp), nil
}

// EvenStages is SplitStages for a pp and layers the caller bounded. One it
// would refuse (a negative pp, more stages than layers, layers outside [1,
// MaxLayers]) gives, without allocating from pp, a list of one boundary,
// which Side.Validate (so NewPlan) refuses: never a list sized from an
// unchecked pp.
func EvenStages(layers, pp int) []int {
	if pp == 0 || pp == 1 {
		return nil
	}
	if pp < 0 || layers < 1 || layers > MaxLayers || pp > layers {
		return []int{0}
	}
	out := make([]int, pp+1)
	for s := range out {
		out[s] = s * layers / pp
	}
	return out
}

// StageLayers returns the layers [lo, hi) stage st holds.
func (s *Side) StageLayers(st int) (lo, hi int) {
	if len(s.Stages) == 0 {
		return 0, s.Layers
	}
	return s.Stages[st], s.Stages[st+1]
}

// heads returns a rank's share: heads per rank and the replication factor.
func (s *Side) heads() (perRank, replicas int) {
	if s.TP <= s.KVHeads {
		return s.KVHeads / s.TP, 1
	}
	return 1, s.TP / s.KVHeads
}

// RankHeads returns the logical KV heads [lo, hi) TP rank r holds.
func (s *Side) RankHeads(r int) (lo, hi int) {
	per, rep := s.heads()
	lo = r / rep * per
	return lo, lo + per
}

// HeadBytes is the bytes of one head of one token.
func (s *Side) HeadBytes() uint64 { return uint64(s.HeadDim) * uint64(s.ElemBytes) }

// ItemLen is the bytes of one page of one K, V or latent buffer of a rank:
// what plan.Buffer.ItemLen must be for the engine's buffers on this side.
func (s *Side) ItemLen() uint64 {
	per, _ := s.heads()
	return uint64(s.PageSize) * uint64(per) * s.HeadBytes()
}

// Validate checks one side on its own; what names it is the side's role in
// errors ("prefill", "decode").
func (s *Side) Validate(what string) error {
	switch {
	case s.Layers < 1 || s.Layers > MaxLayers:
		return badInput("%s: %d layers: must be in [1, %d]", what, s.Layers, MaxLayers)
	case s.KVHeads < 1 || s.KVHeads > MaxHeads:
		return badInput("%s: %d KV heads: must be in [1, %d]", what, s.KVHeads, MaxHeads)
	case s.MLA && s.KVHeads != 1:
		return badInput("%s: MLA with %d KV heads: the latent is one head", what, s.KVHeads)
	case s.HeadDim < 1 || s.ElemBytes < 1 || s.HeadDim > MaxHeadBytes || s.ElemBytes > MaxHeadBytes || s.HeadBytes() > MaxHeadBytes:
		return badInput("%s: head dim %d x %d bytes per element: must be positive and at most %d bytes", what, s.HeadDim, s.ElemBytes, MaxHeadBytes)
	case s.TP < 1 || s.TP > MaxTP:
		return badInput("%s: TP %d: must be in [1, %d]", what, s.TP, MaxTP)
	case s.PageSize < 1 || s.PageSize > MaxPageSize:
		return badInput("%s: page size %d: must be in [1, %d]", what, s.PageSize, MaxPageSize)
	case s.Order != TokenMajor && s.Order != HeadMajor:
		return badInput("%s: page order %d: unknown", what, int(s.Order))
	case !s.MLA && s.TP <= s.KVHeads && s.KVHeads%s.TP != 0:
		return badInput("%s: %d KV heads do not split over TP %d", what, s.KVHeads, s.TP)
	case !s.MLA && s.TP > s.KVHeads && s.TP%s.KVHeads != 0:
		return badInput("%s: TP %d is not a multiple of the %d KV heads it replicates", what, s.TP, s.KVHeads)
	}
	if per, _ := s.heads(); s.HeadsPerRank != 0 && s.HeadsPerRank != per {
		return badInput("%s: %d KV heads per rank, but %d KV heads over TP %d give %d", what, s.HeadsPerRank, s.KVHeads, s.TP, per)
	}
	if len(s.Stages) == 0 {
		return nil
	}
	switch n := len(s.Stages); {
	case n < 2 || n-1 > s.Layers:
		return badInput("%s: %d PP stage boundaries (%d stages) for %d layers: want 2 to %d (the first layer and each stage's end; a stage holds at least one layer)",
			what, n, n-1, s.Layers, s.Layers+1)
	case s.Stages[0] != 0 || s.Stages[n-1] != s.Layers:
		return badInput("%s: PP stages span layers [%d, %d), the model has [0, %d)", what, s.Stages[0], s.Stages[n-1], s.Layers)
	}
	for i := 1; i < len(s.Stages); i++ {
		if s.Stages[i] <= s.Stages[i-1] {
			return badInput("%s: PP stage %d holds layers [%d, %d): empty", what, i-1, s.Stages[i-1], s.Stages[i])
		}
	}
	return nil
}

// ValidateRank checks that r is a rank of the side.
func (s *Side) ValidateRank(what string, r Rank) error {
	switch {
	case r.TP < 0 || r.TP >= s.TP:
		return badInput("%s: TP rank %d: must be in [0, %d)", what, r.TP, s.TP)
	case r.Stage < 0 || r.Stage >= s.PP():
		return badInput("%s: PP stage %d: must be in [0, %d)", what, r.Stage, s.PP())
	}
	return nil
}

// Pairing is a prefill side and a decode side that exchange KV.
type Pairing struct {
	Prefill, Decode Side
	Replicas        ReplicaRule
}

// Validate checks both sides and that they describe the same model with the
// same pages: a pairing that cannot be resharded is refused here, when a
// peer is added, never discovered as a wrong byte.
func (p *Pairing) Validate() error {
	pre, dec := &p.Prefill, &p.Decode
	if err := pre.Validate("prefill"); err != nil {
		return err
	}
	if err := dec.Validate("decode"); err != nil {
		return err
	}
	switch {
	case pre.MLA != dec.MLA:
		return badInput("prefill MLA %v, decode MLA %v: the KV formats differ", pre.MLA, dec.MLA)
	case pre.Layers != dec.Layers:
		return badInput("prefill has %d layers, decode %d", pre.Layers, dec.Layers)
	case pre.KVHeads != dec.KVHeads:
		return badInput("prefill has %d KV heads, decode %d", pre.KVHeads, dec.KVHeads)
	case pre.HeadDim != dec.HeadDim:
		return badInput("prefill head dim %d, decode %d", pre.HeadDim, dec.HeadDim)
	case pre.ElemBytes != dec.ElemBytes:
		return badInput("prefill dtype of %d bytes, decode %d bytes: no conversion on the wire", pre.ElemBytes, dec.ElemBytes)
	case pre.PageSize != dec.PageSize:
		return badInput("prefill page size %d, decode %d: positions map page to page", pre.PageSize, dec.PageSize)
	case p.Replicas != SpreadReplicas && p.Replicas != FirstReplica:
		return badInput("replica rule %d: unknown", int(p.Replicas))
	}
	return nil
}
