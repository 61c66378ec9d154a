package cp

import (
	"testing"

	"github.com/cockroachdb/errors"
)

// The fuzz targets feed arbitrary integers to every function that takes caller
// data: each must return a result or an ErrBadInput error, and never panic.

func FuzzChunkRange(f *testing.F) {
	f.Add(0, 100, 16, false)
	f.Add(96, 200, 16, true)
	f.Add(-1, 0, 0, true)
	f.Fuzz(func(t *testing.T, start, end, ps int, last bool) {
		r, err := ChunkRange(start, end, ps, last)
		if err != nil {
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("unmarked error %v", err)
			}
			return
		}
		if r.End < r.Start || r.End > end || r.Pages < 0 || r.PageStart*ps != r.Start {
			t.Fatalf("inconsistent range %+v for (%d, %d, %d, %v)", r, start, end, ps, last)
		}
		if !last && r.End%ps != 0 {
			t.Fatalf("non-last end %d not floored to %d", r.End, ps)
		}
	})
}

func FuzzOwned(f *testing.F) {
	f.Add(10, 0, 10, 4, 1, false)
	f.Add(10, 6, 20, 4, 0, true)
	f.Add(0, -3, 0, 0, 0, true)
	f.Fuzz(func(t *testing.T, n, pageStart, total, size, rank int, contiguous bool) {
		if n < 0 || n > 4096 || size > 1<<20 {
			return
		}
		rule := SharedKV
		if contiguous {
			rule = Contiguous
		}
		src := make([]int, n)
		for i := range src {
			src[i] = 7 * i
		}
		owned, pos, err := CP{Size: size, Rank: rank, Rule: rule}.Owned(src, pageStart, total)
		if err != nil {
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("unmarked error %v", err)
			}
			return
		}
		if len(owned) != len(pos) {
			t.Fatalf("%d owned pages but %d positions", len(owned), len(pos))
		}
		for i, p := range pos {
			if p < pageStart || p >= pageStart+n || owned[i] != src[p-pageStart] {
				t.Fatalf("position %d / page %d not in the chunk", p, owned[i])
			}
		}
	})
}

func FuzzDstPages(f *testing.F) {
	f.Add(4, 2, -1)
	f.Add(0, 0, 5)
	f.Fuzz(func(t *testing.T, n, a, b int) {
		if n < 0 || n > 4096 {
			return
		}
		dst := make([]int, n)
		got, err := DstPages(dst, []int{a, b})
		if err != nil {
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("unmarked error %v", err)
			}
			return
		}
		if len(got) != 2 {
			t.Fatalf("got %d pages", len(got))
		}
	})
}

func FuzzCoalesce(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4}, []byte{5, 6, 9, 10})
	f.Fuzz(func(t *testing.T, s, d []byte) {
		src, dst := make([]int, len(s)), make([]int, len(d))
		for i, b := range s {
			src[i] = int(b)
		}
		for i, b := range d {
			dst[i] = int(b)
		}
		runs, err := Coalesce(src, dst)
		if err != nil {
			if !errors.Is(err, ErrBadInput) || len(s) == len(d) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if Pages(runs) != len(src) {
			t.Fatalf("runs cover %d pages, want %d", Pages(runs), len(src))
		}
	})
}
