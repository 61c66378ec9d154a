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

// FuzzStrideRuns checks the plan's fused path against the lists it
// replaces: OwnedStride and StrideRuns give exactly Owned's count and
// Coalesce(owned, DstPages(dst, positions))'s runs, or the same error.
func FuzzStrideRuns(f *testing.F) {
	f.Add(10, 0, 10, 4, 1, false, 12, uint64(1), 3)
	f.Add(10, 6, 20, 4, 0, true, 20, uint64(2), 1)
	f.Add(100, 0, 100, 1, 0, false, 100, uint64(3), 7)
	f.Add(16, 4, 20, 2, 1, false, 10, uint64(4), 2)
	f.Add(0, 0, 0, 1, 0, true, 0, uint64(5), 1)
	f.Fuzz(func(t *testing.T, n, pageStart, total, size, rank int, contiguous bool, dstLen int, seed uint64, runLen int) {
		if n < 0 || n > 4096 || size > 1<<20 || dstLen < 0 || dstLen > 8192 || runLen < 1 {
			return
		}
		rule := SharedKV
		if contiguous {
			rule = Contiguous
		}
		c := CP{Size: size, Rank: rank, Rule: rule}
		src := make([]int, n)
		for i := range src {
			src[i] = 3*i - int(seed%5) // runs of 1 and negative pages: not checked here
			if i%5 == 4 {
				src[i] = src[i-1] + 1
			}
		}
		// Destination pages in runs of runLen, runs in a scrambled order.
		dst := make([]int, dstLen)
		for i := range dst {
			blk := i / runLen
			dst[i] = int((uint64(blk)*2654435761+seed)%uint64(dstLen+1))*runLen + i%runLen
		}
		owned, pos, wantErr := c.Owned(src, pageStart, total)
		st, err := c.OwnedStride(n, pageStart, total)
		if (wantErr == nil) != (err == nil) || (err != nil && err.Error() != wantErr.Error()) {
			t.Fatalf("OwnedStride error %v, Owned %v", err, wantErr)
		}
		if err != nil {
			return
		}
		if st.N != len(owned) {
			t.Fatalf("stride %+v of %d positions, Owned %d", st, st.N, len(owned))
		}
		for k, p := range pos {
			if st.At(k) != p {
				t.Fatalf("position %d: stride %d, Owned %d", k, st.At(k), p)
			}
		}
		var want []Run
		mapped, wantErr := DstPages(dst, pos)
		if wantErr == nil {
			want, wantErr = Coalesce(owned, mapped)
		}
		got, err := StrideRuns(src, pageStart, dst, st)
		if (wantErr == nil) != (err == nil) || (err != nil && err.Error() != wantErr.Error()) {
			t.Fatalf("StrideRuns error %v, lists %v", err, wantErr)
		}
		if err != nil {
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("unmarked error %v", err)
			}
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%d runs, want %d: %v / %v", len(got), len(want), got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("run %d: %+v, want %+v", i, got[i], want[i])
			}
		}
		if len(got) > 0 && cap(got) != len(got) {
			t.Fatalf("runs slice of capacity %d for %d runs", cap(got), len(got))
		}
	})
}
