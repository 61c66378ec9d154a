package cp

import (
	"fmt"
	"math/bits"

	"github.com/cockroachdb/errors"
)

// Source is the source side of a chunk's runs, shared by every destination
// of the chunk: the positions this rank owns (a Stride), the source pages
// behind them, and where the source pages alone break a run. NewSource
// reads the source pages once; Runs and CheckedRuns then do only one
// destination's work, so a chunk toward 32 destinations with 32 different
// page lists does not read its source pages 64 times.
type Source struct {
	st Stride
	// s is src from the first owned position's page to the last's; owned
	// page k is s[k*st.Step], at index off+k*st.Step of src.
	s   []int
	off int
	// brk has bit k set where owned page k does not continue owned page
	// k-1 on the source side; nil where none does not (one source run).
	brk []uint64
}

// NewSource is the source side of StrideRuns(src, chunkPageStart, _, st).
// A position of st outside the chunk's source pages is an error, and so
// are more owned positions than a run's length holds (MaxPage).
func NewSource(src []int, chunkPageStart int, st Stride) (*Source, error) {
	if st.N == 0 {
		return &Source{st: st}, nil
	}
	last := st.At(st.N - 1)
	if st.First < chunkPageStart || last-chunkPageStart >= len(src) {
		return nil, badInput("positions [%d, %d] outside the chunk's %d source pages from position %d", st.First, last, len(src), chunkPageStart)
	}
	if st.N > MaxPage {
		return nil, badInput("%d owned positions: more than a run's length holds (%d)", st.N, MaxPage)
	}
	s := src[st.First-chunkPageStart : last-chunkPageStart+1]
	var brk []uint64
	for k, i := 1, st.Step; i < len(s); k, i = k+1, i+st.Step {
		if s[i] != s[i-st.Step]+1 {
			if brk == nil {
				brk = make([]uint64, (st.N+63)/64)
			}
			brk[k>>6] |= 1 << (k & 63)
		}
	}
	return &Source{st: st, s: s, off: st.First - chunkPageStart, brk: brk}, nil
}

// NewCheckedSource is CheckPages("source", src, capacity) followed by
// NewSource(src, chunkPageStart, st), with the check's error first. With
// consecutive owned positions the source's breaks are the check's run
// starts, and the source pages are read once.
func NewCheckedSource(src []int, chunkPageStart int, st Stride, capacity int) (*Source, error) {
	starts, err := checkRuns("source", src, capacity)
	if err != nil {
		return nil, err
	}
	if st.N == 0 || st.Step != 1 || st.N > MaxPage {
		return NewSource(src, chunkPageStart, st) // and its errors
	}
	last := st.At(st.N - 1)
	if st.First < chunkPageStart || last-chunkPageStart >= len(src) {
		return NewSource(src, chunkPageStart, st) // its error
	}
	off := st.First - chunkPageStart
	brk := extractBits(starts, off, st.N)
	brk[0] &^= 1 // the first owned page starts a run whatever the source
	for _, w := range brk {
		if w != 0 {
			return &Source{st: st, s: src[off : last-chunkPageStart+1], off: off, brk: brk}, nil
		}
	}
	return &Source{st: st, s: src[off : last-chunkPageStart+1], off: off}, nil
}

// extractBits returns bits [from, from+n) of bm (n > 0, within bm) as a
// bitmap of their own.
func extractBits(bm []uint64, from, n int) []uint64 {
	out := make([]uint64, (n+63)/64)
	base, sh := from>>6, uint(from&63)
	for q := range out {
		w := bm[base+q] >> sh
		if sh != 0 && base+q+1 < len(bm) {
			w |= bm[base+q+1] << (64 - sh)
		}
		out[q] = w
	}
	if r := n & 63; r != 0 {
		out[len(out)-1] &= 1<<uint(r) - 1
	}
	return out
}

// Stride is the owned positions.
func (s *Source) Stride() Stride { return s.st }

// Runs is StrideRuns for the source s was made from: the runs toward one
// destination whose request page list is dstPages. A position beyond
// dstPages is an error that names it.
func (s *Source) Runs(dstPages []int) ([]Run, error) {
	if s.st.N == 0 {
		return nil, nil
	}
	if err := s.inRange(dstPages); err != nil {
		return nil, err
	}
	d := s.dst(dstPages)
	return s.fill(d, s.count(d))
}

// CheckedRuns is CheckPages("destination", dstPages, capacity) followed by
// Runs(dstPages), with the check's error first. When the owned positions
// are consecutive (every CP rule but shared-KV with more than one rank) the
// runs are built from the check's (checkRuns): the list is read page by
// page once to find its runs, and then per run, not per page, unless its
// runs are short.
func (s *Source) CheckedRuns(dstPages []int, capacity int) ([]Run, error) {
	if s.st.N == 0 || s.st.Step != 1 || s.inRange(dstPages) != nil {
		if err := CheckPages("destination", dstPages, capacity); err != nil {
			return nil, err
		}
		return s.Runs(dstPages)
	}
	starts, err := checkRuns("destination", dstPages, capacity)
	if err != nil {
		return nil, err
	}
	return s.fillFrom(dstPages, starts)
}

// fillFrom builds the runs of consecutive owned positions from the starts
// of dstPages's own runs (checkRuns): a run starts where the destination's
// run does, where the source breaks, and at the first owned position.
func (s *Source) fillFrom(dstPages []int, starts []uint64) ([]Run, error) {
	first, n := s.st.First, s.st.N
	ob := extractBits(starts, first, n)
	ob[0] |= 1
	count := 0
	for q, w := range ob {
		if s.brk != nil {
			w |= s.brk[q]
			ob[q] = w
		}
		count += bits.OnesCount64(w)
	}
	// One run per set bit, in order; a run's length is known at the next,
	// and the run is stored then, whole: the run being built stays in
	// registers (sp, dp: its first pages; at: its position).
	src, d := s.s[:n], dstPages[first:first+n]
	runs := make([]Run, count)
	// big is non-zero once a run's first page does not fit a Run: one
	// test after the loop, not a branch per run.
	sp, dp, at, big := src[0], d[0], 0, 0
	r := 0
	ob[0] &^= 1
	for q, w := range ob {
		if w == ^uint64(0) && q<<6+64 <= n {
			// Every page of the word starts a run (a list whose every
			// page is its own run): 64 runs of one page, no bit search.
			i0 := q << 6
			big |= sp ^ int(int32(sp)) | dp ^ int(int32(dp))
			runs[r] = Run{Src: int32(sp), Dst: int32(dp), Len: int32(i0 - at)}
			ss, dd, out := (*[64]int)(src[i0:i0+64]), (*[64]int)(d[i0:i0+64]), (*[63]Run)(runs[r+1:r+64])
			for j := range out {
				sp, dp := ss[j], dd[j]
				big |= sp ^ int(int32(sp)) | dp ^ int(int32(dp))
				out[j] = Run{Src: int32(sp), Dst: int32(dp), Len: 1}
			}
			sp, dp, at, r = ss[63], dd[63], i0+63, r+64
			continue
		}
		for w != 0 {
			i := q<<6 + bits.TrailingZeros64(w)
			w &= w - 1
			big |= sp ^ int(int32(sp)) | dp ^ int(int32(dp))
			runs[r] = Run{Src: int32(sp), Dst: int32(dp), Len: int32(i - at)}
			sp, dp, at, r = src[i], d[i], i, r+1
		}
	}
	big |= sp ^ int(int32(sp)) | dp ^ int(int32(dp))
	runs[r] = Run{Src: int32(sp), Dst: int32(dp), Len: int32(n - at)}
	if big != 0 {
		return nil, s.tooLarge(runs, d)
	}
	return runs, nil
}

// tooLarge names the first run start whose source or destination page
// does not fit a Run (its source page first), d being the destination
// pages from the first owned position (dst). The runs hold the starts
// truncated; their lengths are right.
func (s *Source) tooLarge(runs []Run, d []int) error {
	k := 0 // owned position of the run
	for _, r := range runs {
		i := k * s.st.Step
		if sp := s.s[i]; !fits(sp) {
			return tooLarge("source", sp, s.off+i)
		}
		if dp := d[i]; !fits(dp) {
			return tooLarge("destination", dp, s.st.First+i)
		}
		k += int(r.Len)
	}
	return errors.AssertionFailedf("runs: a page beyond %d that no run starts with", MaxPage)
}

// inRange reports a position beyond dstPages, naming the first and how
// many others (DstPages's error).
func (s *Source) inRange(dstPages []int) error {
	if s.st.First >= 0 && s.st.At(s.st.N-1) < len(dstPages) {
		return nil
	}
	bad, first := 0, -1
	for k := 0; k < s.st.N; k++ {
		if p := s.st.At(k); p < 0 || p >= len(dstPages) {
			if bad == 0 {
				first = p
			}
			bad++
		}
	}
	return badInput("position %d (and %d more) beyond the destination page list of %d pages", first, bad-1, len(dstPages))
}

// dst is dstPages from the first owned position to the last (in range).
func (s *Source) dst(dstPages []int) []int {
	return dstPages[s.st.First : s.st.At(s.st.N-1)+1]
}

// count is how many runs d (the destination pages from the first owned
// position, Step apart) makes with the source.
func (s *Source) count(d []int) int {
	step, brk, n := s.st.Step, s.brk, 1
	for k, i := 1, step; i < len(d); k, i = k+1, i+step {
		if d[i] != d[i-step]+1 || (brk != nil && brk[k>>6]&(1<<(k&63)) != 0) {
			n++
		}
	}
	return n
}

// fill builds the n runs of d (as count counted them) into a slice of
// exactly that many.
func (s *Source) fill(d []int, n int) ([]Run, error) {
	// Locals, not s's fields: the stores into runs could alias them, and
	// the loop would load them again at every page.
	step, src, brk := s.st.Step, s.s, s.brk
	runs := make([]Run, 0, n)
	// The run being built: its first page's index in d and the
	// destination page that would continue it; big as in fillFrom.
	at, next, big := 0, d[0]+1, 0
	add := func(at, next int) {
		sp, dp := src[at], d[at]
		big |= sp ^ int(int32(sp)) | dp ^ int(int32(dp))
		runs = append(runs, Run{Src: int32(sp), Dst: int32(dp), Len: int32(next - dp)})
	}
	for k, i := 1, step; i < len(d); k, i = k+1, i+step {
		if d[i] == next && (brk == nil || brk[k>>6]&(1<<(k&63)) == 0) {
			next++
			continue
		}
		add(at, next)
		at, next = i, d[i]+1
	}
	add(at, next)
	if big != 0 {
		return nil, s.tooLarge(runs, d)
	}
	return runs, nil
}

// CheckPages rejects negative, out-of-range and duplicate page ids, naming
// the first bad page, its index and the pool (what: "source" or
// "destination").
func CheckPages(what string, pages []int, capacity int) error {
	return checkPages(what, pages, capacity)
}

// checkRuns is CheckPages, returning where the list's runs of consecutive
// pages start (bit i: pages[i] != pages[i-1]+1, and bit 0). A list of long
// runs is read once to find the starts; then each run is checked at its
// ends (its pages are consecutive: inside the pool if both ends are) and
// marks its pages in the pool's bitmap a word at a time, so that it costs
// a compare per page. A list of short runs (its first probePages pages
// say so) is checked page by page in the same pass that finds its starts
// (checkStarts): one read of the list, not two. A bad list is checked
// again page by page for the first bad page's error.
func checkRuns(what string, pages []int, capacity int) ([]uint64, error) {
	if len(pages) == 0 {
		return nil, nil
	}
	starts := make([]uint64, (len(pages)+63)/64)
	probe := len(pages)
	if probe > probePages {
		probe = probePages
	}
	runStarts(pages[:probe], starts)
	if probe < len(pages) && ones(starts[:probe>>6]) > probe/4 {
		if err := checkStarts(what, pages, capacity, starts); err != nil {
			return nil, err
		}
		return starts, nil
	}
	if probe < len(pages) {
		runStartsFrom(pages, probe, starts)
	}
	if ones(starts) > len(pages)/4 {
		// Short runs after all: the page-by-page check is the faster.
		if err := CheckPages(what, pages, capacity); err != nil {
			return nil, err
		}
		return starts, nil
	}
	seen := make([]uint64, (max(capacity, 0)+63)/64)
	prev := 0
	for q, w := range starts {
		for w != 0 {
			i := q<<6 + bits.TrailingZeros64(w)
			w &= w - 1
			if i > 0 && !claim(seen, pages, prev, i, capacity) {
				// At once: a run that failed its claim is not known to be
				// a run (its pages may leave the pool), and a later claim
				// from it would read past seen.
				return nil, checkSlow(what, pages, capacity)
			}
			prev = i
		}
	}
	if !claim(seen, pages, prev, len(pages), capacity) {
		return nil, checkSlow(what, pages, capacity)
	}
	return starts, nil
}

// probePages is how many pages at the head of a list decide how checkRuns
// checks it: more than a quarter of them starting a run, page by page. A
// multiple of 64.
const probePages = 1024

// ones is how many bits of bm are set.
func ones(bm []uint64) int {
	n := 0
	for _, w := range bm {
		n += bits.OnesCount64(w)
	}
	return n
}

// runStarts sets bit i of starts where pages[i] does not continue
// pages[i-1], and bit 0 (runStartsFrom from 0).
func runStarts(pages []int, starts []uint64) {
	runStartsFrom(pages, 0, starts)
	starts[0] |= 1
}

// runStartsFrom sets the words of starts from page from on (a multiple of
// 64): bit i where pages[i] does not continue pages[i-1].
func runStartsFrom(pages []int, from int, starts []uint64) {
	prev := pages[from] - 1
	if from > 0 {
		prev = pages[from-1]
	}
	full := len(pages) &^ 63
	for base := from; base < full; base += 64 {
		blk := (*[64]int)(pages[base : base+64])
		starts[base>>6] = startsWord(blk, prev)
		prev = blk[63]
	}
	if full < len(pages) { // full >= from: from is a multiple of 64
		starts[full>>6] = startsTail(pages[full:], prev)
	}
}

// startsWord is the word of run starts of 64 pages after page prev: bit j
// where blk[j] does not continue the page before it. The word is shifted
// in by constant shifts, four pages a step: four independent compares, one
// shift (a quarter faster than a page a step here).
func startsWord(blk *[64]int, prev int) uint64 {
	var w uint64
	for j := 0; j < 64; j += 4 {
		a, b, c, d := blk[j], blk[j+1], blk[j+2], blk[j+3]
		var x uint64
		if a != prev+1 {
			x |= 1 << 60
		}
		if b != a+1 {
			x |= 1 << 61
		}
		if c != b+1 {
			x |= 1 << 62
		}
		if d != c+1 {
			x |= 1 << 63
		}
		w = w>>4 | x
		prev = d
	}
	return w
}

// startsTail is startsWord for fewer than 64 pages (at least one).
func startsTail(pages []int, prev int) uint64 {
	var w uint64
	for _, pg := range pages {
		var b uint64
		if pg != prev+1 {
			b = 1 << 63
		}
		w = w>>1 | b
		prev = pg
	}
	return w >> uint(64-len(pages))
}

// checkStarts is checkPages that also sets starts as runStarts does, 64
// pages at a time while they are in the nearest cache, marking the pages
// with checkScattered: for a list of short runs, whose check is page by
// page anyway, the list is read from memory once.
func checkStarts(what string, pages []int, capacity int, starts []uint64) error {
	seen := make([]uint64, (max(capacity, 0)+63)/64)
	prev := pages[0] - 1
	for base := 0; base < len(pages); base += 64 {
		blk := pages[base:min(base+64, len(pages))]
		if len(blk) == 64 {
			starts[base>>6] = startsWord((*[64]int)(blk), prev)
		} else {
			starts[base>>6] = startsTail(blk, prev)
		}
		prev = blk[len(blk)-1]
		if i, bad := checkScattered(seen, blk, capacity); bad != "" {
			return badInput("%s page %d at index %d: %s", what, blk[i], base+i, bad)
		}
	}
	starts[0] |= 1
	return nil
}

// checkScattered is checkInto for pages that seldom share a word of seen
// (short runs): each page loads and stores its own word, with no chain
// from one page to the next through a word kept in a register (a third
// faster on a shuffled list).
func checkScattered(seen []uint64, pages []int, capacity int) (int, string) {
	for i, pg := range pages {
		u := uint(pg)
		if u >= uint(capacity) {
			return i, fmt.Sprintf("outside the pool of %d pages", capacity)
		}
		w := &seen[u>>6]
		bit := uint64(1) << (u & 63)
		if *w&bit != 0 {
			return i, "duplicate"
		}
		*w |= bit
	}
	return 0, ""
}

// checkInto marks pages in seen and returns the index of the first page
// outside the pool of capacity pages or marked already, and why ("" if
// none). The word of seen being filled stays in a register while the
// pages fall in it.
func checkInto(seen []uint64, pages []int, capacity int) (int, string) {
	cw, cur := -1, uint64(0)
	for i, pg := range pages {
		u := uint(pg)
		if u >= uint(capacity) {
			return i, fmt.Sprintf("outside the pool of %d pages", capacity)
		}
		if w := int(u >> 6); w != cw {
			if cw >= 0 {
				seen[cw] = cur
			}
			cw, cur = w, seen[w]
		}
		bit := uint64(1) << (u & 63)
		if cur&bit != 0 {
			return i, "duplicate"
		}
		cur |= bit
	}
	if cw >= 0 {
		seen[cw] = cur
	}
	return 0, ""
}

// claim checks the run pages[a:b] (consecutive pages) against the pool
// and sets its bits in seen, reporting whether it is inside the pool and
// none of its bits was set.
func claim(seen []uint64, pages []int, a, b, capacity int) bool {
	lo := pages[a]
	if uint(lo) >= uint(capacity) || uint(pages[b-1]) >= uint(capacity) {
		return false
	}
	if b-a == 1 {
		w, bit := lo>>6, uint64(1)<<uint(lo&63)
		if seen[w]&bit != 0 {
			return false
		}
		seen[w] |= bit
		return true
	}
	for hi := lo + b - a; lo < hi; {
		sh := uint(lo & 63)
		cnt := min(64-int(sh), hi-lo)
		mask := ^uint64(0) >> uint(64-cnt) << sh
		if seen[lo>>6]&mask != 0 {
			return false
		}
		seen[lo>>6] |= mask
		lo += cnt
	}
	return true
}

// checkSlow checks pages one by one and returns the first bad one's error.
// checkRuns found one: not finding it is a bug.
func checkSlow(what string, pages []int, capacity int) error {
	if err := CheckPages(what, pages, capacity); err != nil {
		return err
	}
	return errors.AssertionFailedf("%s pages: the run check found a bad page that the page check did not", what)
}

// checkPages is the page-by-page check (checkInto: fast along runs of
// consecutive pages).
func checkPages(what string, pages []int, capacity int) error {
	seen := make([]uint64, (max(capacity, 0)+63)/64)
	if i, bad := checkInto(seen, pages, capacity); bad != "" {
		return badInput("%s page %d at index %d: %s", what, pages[i], i, bad)
	}
	return nil
}
