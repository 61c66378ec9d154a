package cp

import "math"

// Run is a maximal stretch of pages that are consecutive on both sides:
// source pages [Src, Src+Len) go to destination pages [Dst, Dst+Len).
// Its fields are 32 bits: a chunk whose every decode page is its own run
// is 100 000 runs of 12 bytes, not 24, written at every registration. A
// run whose first page (on either side) or length does not fit is an
// ErrBadInput where runs are made; the pages after its first may go past
// MaxPage, which its users add in 64 bits (Src+Len up to 2^32).
type Run struct {
	Src, Dst, Len int32
}

// MaxPage is the largest page index (and run length) a Run holds.
const MaxPage = math.MaxInt32

// fits reports whether page index v fits a Run's field.
func fits(v int) bool { return v == int(int32(v)) }

// tooLarge is the error of a page that does not fit a Run.
func tooLarge(what string, pg, i int) error {
	return badInput("%s page %d at index %d: beyond the largest page index a run holds (%d)", what, pg, i, MaxPage)
}

// Coalesce merges (src[i], dst[i]) page pairs into runs. A run breaks where
// either side is not consecutive. Runs are computed once per chunk and are the
// same for every buffer, because every buffer is indexed by the same pages.
// A run's first page that does not fit a Run (MaxPage) is an error naming
// it.
func Coalesce(src, dst []int) ([]Run, error) {
	if len(src) != len(dst) {
		return nil, badInput("%d source pages but %d destination pages", len(src), len(dst))
	}
	var runs []Run
	for i := range src {
		if n := len(runs); n > 0 {
			r := &runs[n-1]
			if src[i] == int(r.Src)+int(r.Len) && dst[i] == int(r.Dst)+int(r.Len) && r.Len < MaxPage {
				r.Len++
				continue
			}
		}
		switch {
		case !fits(src[i]):
			return nil, tooLarge("source", src[i], i)
		case !fits(dst[i]):
			return nil, tooLarge("destination", dst[i], i)
		}
		runs = append(runs, Run{Src: int32(src[i]), Dst: int32(dst[i]), Len: 1})
	}
	return runs, nil
}

// StrideRuns is Coalesce(owned, DstPages(dstPages, positions)) for the
// positions of st (OwnedStride) and owned[k] = src[st.At(k)-chunkPageStart],
// without building either list: one pass counts the runs, a second fills a
// slice of exactly that many (NewSource, then Source.Runs). A position beyond dstPages is DstPages's
// error. It is the plan's hot loop: a 100k-page chunk whose every decode
// page is its own run is 100 000 runs.
func StrideRuns(src []int, chunkPageStart int, dstPages []int, st Stride) ([]Run, error) {
	s, err := NewSource(src, chunkPageStart, st)
	if err != nil {
		return nil, err
	}
	return s.Runs(dstPages)
}

// Pages returns how many pages the runs cover.
func Pages(runs []Run) int {
	n := 0
	for _, r := range runs {
		n += int(r.Len)
	}
	return n
}

// Block is one contiguous write of one buffer: Len bytes from Src to Dst.
type Block struct {
	Src, Dst, Len uint64
}

// AppendBlocks appends one buffer's blocks for runs to bs and returns the
// extended slice: run r becomes (srcBase + r.Src*itemLen, dstBase +
// r.Dst*itemLen, r.Len*itemLen). Appending to a reused slice keeps the
// submitter's hot loop allocation-free.
func AppendBlocks(bs []Block, runs []Run, srcBase, dstBase, itemLen uint64) []Block {
	for _, r := range runs {
		bs = append(bs, Block{
			Src: srcBase + uint64(r.Src)*itemLen,
			Dst: dstBase + uint64(r.Dst)*itemLen,
			Len: uint64(r.Len) * itemLen,
		})
	}
	return bs
}
