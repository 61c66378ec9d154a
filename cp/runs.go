package cp

// Run is a maximal stretch of pages that are consecutive on both sides:
// source pages [Src, Src+Len) go to destination pages [Dst, Dst+Len).
type Run struct {
	Src, Dst, Len int
}

// Coalesce merges (src[i], dst[i]) page pairs into runs. A run breaks where
// either side is not consecutive. Runs are computed once per chunk and are the
// same for every buffer, because every buffer is indexed by the same pages.
func Coalesce(src, dst []int) ([]Run, error) {
	if len(src) != len(dst) {
		return nil, badInput("%d source pages but %d destination pages", len(src), len(dst))
	}
	var runs []Run
	for i := range src {
		if n := len(runs); n > 0 {
			r := &runs[n-1]
			if src[i] == r.Src+r.Len && dst[i] == r.Dst+r.Len {
				r.Len++
				continue
			}
		}
		runs = append(runs, Run{Src: src[i], Dst: dst[i], Len: 1})
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
		n += r.Len
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
