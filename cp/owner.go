package cp

import "strconv"

// Rule names how context-parallel ranks split a request's pages.
type Rule int

const (
	// SharedKV gives absolute page position p to rank p % cpSize: the rule of
	// CP shared-KV prefill, where every rank computes every layer but each
	// page is held (and sent) by exactly one rank.
	SharedKV Rule = iota
	// Contiguous gives each rank one balanced contiguous slice of the
	// request's pages (non-shared CP).
	Contiguous
)

// String returns the flag spelling of the rule.
func (r Rule) String() string {
	switch r {
	case SharedKV:
		return "shared"
	case Contiguous:
		return "contiguous"
	}
	return "Rule(" + strconv.Itoa(int(r)) + ")"
}

// ParseRule reads the flag spelling of a rule.
func ParseRule(s string) (Rule, error) {
	switch s {
	case "shared", "shared-kv":
		return SharedKV, nil
	case "contiguous":
		return Contiguous, nil
	}
	return 0, badInput("CP rule %q: want shared or contiguous", s)
}

// CP is one rank's place in a context-parallel group.
type CP struct {
	Size int
	Rank int
	Rule Rule
}

// Validate checks that the rank exists in the group.
func (c CP) Validate() error {
	switch {
	case c.Size < 1:
		return badInput("CP size %d: must be at least 1", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return badInput("CP rank %d: must be in [0, %d)", c.Rank, c.Size)
	case c.Rule != SharedKV && c.Rule != Contiguous:
		return badInput("CP rule %d: unknown", int(c.Rule))
	}
	return nil
}

// Owned filters a chunk's source pages to those this rank owns and returns
// them with their ABSOLUTE page positions in the request (invariant 5).
// src[i] backs position chunkPageStart+i; totalPages is the request's page
// count, which only the contiguous rule needs.
func (c CP) Owned(src []int, chunkPageStart, totalPages int) (owned, positions []int, err error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	switch c.Rule {
	case SharedKV:
		return OwnedShared(src, chunkPageStart, c.Size, c.Rank)
	default:
		return OwnedContiguous(src, chunkPageStart, totalPages, c.Size, c.Rank)
	}
}

// Stride is the positions a rank owns in a chunk, an arithmetic progression
// under both rules: First, First+Step, ..., N of them. Source page i of the
// chunk backs position chunkPageStart+i.
type Stride struct {
	First, Step, N int
}

// At returns the k-th position.
func (s Stride) At(k int) int { return s.First + k*s.Step }

// OwnedStride is Owned without the page lists: the positions of a chunk of
// srcLen pages from chunkPageStart that this rank owns (totalPages: the
// request's page count, which only the contiguous rule needs). Owned's
// lists are src[p-chunkPageStart] and p for each position p of it.
func (c CP) OwnedStride(srcLen, chunkPageStart, totalPages int) (Stride, error) {
	if err := c.Validate(); err != nil {
		return Stride{}, err
	}
	if chunkPageStart < 0 {
		return Stride{}, badInput("chunk page start %d: must not be negative", chunkPageStart)
	}
	if c.Rule == SharedKV {
		first := chunkPageStart + ((c.Rank-chunkPageStart)%c.Size+c.Size)%c.Size
		n := 0
		if i := first - chunkPageStart; i < srcLen {
			n = (srcLen-i-1)/c.Size + 1
		}
		return Stride{First: first, Step: c.Size, N: n}, nil
	}
	if end := chunkPageStart + srcLen; end > totalPages {
		return Stride{}, badInput("chunk pages [%d, %d) beyond the request's %d pages", chunkPageStart, end, totalPages)
	}
	lo, hi, err := ContiguousSlice(totalPages, c.Size, c.Rank)
	if err != nil {
		return Stride{}, err
	}
	lo, hi = max(lo, chunkPageStart), min(hi, chunkPageStart+srcLen)
	if hi <= lo {
		return Stride{First: chunkPageStart, Step: 1}, nil
	}
	return Stride{First: lo, Step: 1, N: hi - lo}, nil
}

// OwnedShared applies the shared-KV rule: position p belongs to rank
// p % cpSize.
func OwnedShared(src []int, chunkPageStart, cpSize, rank int) (owned, positions []int, err error) {
	if err := (CP{Size: cpSize, Rank: rank}).Validate(); err != nil {
		return nil, nil, err
	}
	if chunkPageStart < 0 {
		return nil, nil, badInput("chunk page start %d: must not be negative", chunkPageStart)
	}
	// The first owned position is the smallest p >= chunkPageStart with
	// p % cpSize == rank; from there every cpSize-th page is ours.
	first := chunkPageStart + ((rank-chunkPageStart)%cpSize+cpSize)%cpSize
	n := 0
	if i := first - chunkPageStart; i < len(src) {
		n = (len(src)-i-1)/cpSize + 1
	}
	owned = make([]int, 0, n)
	positions = make([]int, 0, n)
	for p := first; p-chunkPageStart < len(src); p += cpSize {
		owned = append(owned, src[p-chunkPageStart])
		positions = append(positions, p)
	}
	return owned, positions, nil
}

// ContiguousSlice returns the positions [lo, hi) that rank owns among
// totalPages under the contiguous rule: base = T/cp, rem = T%cp, rank r owns
// [r*base + min(r, rem), +base + (r < rem)).
func ContiguousSlice(totalPages, cpSize, rank int) (lo, hi int, err error) {
	if err := (CP{Size: cpSize, Rank: rank}).Validate(); err != nil {
		return 0, 0, err
	}
	if totalPages < 0 {
		return 0, 0, badInput("request pages %d: must not be negative", totalPages)
	}
	base, rem := totalPages/cpSize, totalPages%cpSize
	lo = rank*base + min(rank, rem)
	hi = lo + base
	if rank < rem {
		hi++
	}
	return lo, hi, nil
}

// OwnedContiguous applies the contiguous rule, clipped to the chunk.
func OwnedContiguous(src []int, chunkPageStart, totalPages, cpSize, rank int) (owned, positions []int, err error) {
	if chunkPageStart < 0 {
		return nil, nil, badInput("chunk page start %d: must not be negative", chunkPageStart)
	}
	if end := chunkPageStart + len(src); end > totalPages {
		return nil, nil, badInput("chunk pages [%d, %d) beyond the request's %d pages", chunkPageStart, end, totalPages)
	}
	lo, hi, err := ContiguousSlice(totalPages, cpSize, rank)
	if err != nil {
		return nil, nil, err
	}
	lo, hi = max(lo, chunkPageStart), min(hi, chunkPageStart+len(src))
	if hi <= lo {
		return []int{}, []int{}, nil
	}
	owned = make([]int, 0, hi-lo)
	positions = make([]int, 0, hi-lo)
	for p := lo; p < hi; p++ {
		owned = append(owned, src[p-chunkPageStart])
		positions = append(positions, p)
	}
	return owned, positions, nil
}

// DstPages maps absolute positions to one decode destination's pages:
// dst[i] = dstPages[positions[i]]. A position beyond the destination list is
// an error that names it (and how many others are out of range), never a
// panic: it means the decode side allocated fewer pages than prefill sends.
func DstPages(dstPages, positions []int) ([]int, error) {
	out := make([]int, len(positions))
	bad, first := 0, -1
	for i, p := range positions {
		if p < 0 || p >= len(dstPages) {
			if bad == 0 {
				first = p
			}
			bad++
			continue
		}
		out[i] = dstPages[p]
	}
	if bad > 0 {
		return nil, badInput("position %d (and %d more) beyond the destination page list of %d pages", first, bad-1, len(dstPages))
	}
	return out, nil
}
