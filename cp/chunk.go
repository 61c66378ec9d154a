package cp

// Range is the token range one forward writes for one request, and the pages
// that back it. Pages are counted in the request's own page positions: the
// chunk covers positions [PageStart, PageStart+Pages).
type Range struct {
	Start     int // first token, page aligned
	End       int // one past the last token; page-floored unless Last
	PageStart int // Start / pageSize: the absolute position of the chunk's first page
	Pages     int // pages that back [Start, End); the last one may be partial when Last
	Last      bool
}

// Empty reports whether the chunk has no page to send.
func (r Range) Empty() bool { return r.Pages == 0 }

// ChunkRange returns the exact range a forward transmits for tokens
// [start, end) (invariant 6). A non-last chunk sends only whole pages, so its
// end is floored to a page boundary (the remainder goes with the next chunk);
// the last chunk keeps its end and its partial last page. start must be page
// aligned because the previous chunk ended on a page boundary.
func ChunkRange(start, end, pageSize int, last bool) (Range, error) {
	switch {
	case pageSize <= 0:
		return Range{}, badInput("page size %d: must be positive", pageSize)
	case start < 0:
		return Range{}, badInput("chunk start %d: must not be negative", start)
	case start%pageSize != 0:
		return Range{}, badInput("chunk start %d: not aligned to page size %d", start, pageSize)
	case end < start:
		return Range{}, badInput("chunk end %d before start %d", end, start)
	}
	if !last {
		end -= end % pageSize
		if end < start {
			end = start
		}
	}
	// Divided before rounded up: end - start + pageSize - 1 overflows for
	// an end near math.MaxInt (the range then "needed" a negative page
	// count). end - start cannot overflow: 0 <= start <= end.
	n := end - start
	pages := n / pageSize
	if n%pageSize != 0 {
		pages++
	}
	return Range{Start: start, End: end, PageStart: start / pageSize, Pages: pages, Last: last}, nil
}
