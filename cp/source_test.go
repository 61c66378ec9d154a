package cp

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// refCheck is the page check written plainly: the first page outside the
// pool or seen before, in index order.
func refCheck(what string, pages []int, capacity int) error {
	seen := map[int]bool{}
	for i, pg := range pages {
		if pg < 0 || pg >= capacity {
			return badInput("%s page %d at index %d: outside the pool of %d pages", what, pg, i, capacity)
		}
		if seen[pg] {
			return badInput("%s page %d at index %d: duplicate", what, pg, i)
		}
		seen[pg] = true
	}
	return nil
}

// drawPages is a list of n pages from a pool of about pool pages, in runs
// of consecutive pages whose lengths and order are drawn, with at times a
// planted fault (a duplicate, a page outside the pool, a negative page).
func drawPages(t *rapid.T, label string, n, pool int) []int {
	runLen := rapid.SampledFrom([]int{1, 2, 3, 16, 63, 64, 65, 200, 1 << 20}).Draw(t, label+"RunLen")
	blocks := (pool + runLen - 1) / runLen
	perm := rapid.Permutation(seq(0, min(blocks, 4096))).Draw(t, label+"Blocks")
	out := make([]int, 0, n)
	for _, b := range perm {
		for p := b * runLen; p < min((b+1)*runLen, pool) && len(out) < n; p++ {
			out = append(out, p)
		}
	}
	for len(out) < n { // a pool too small: pages beyond it
		out = append(out, pool+len(out))
	}
	if len(out) > 0 {
		switch rapid.IntRange(0, 6).Draw(t, label+"Fault") {
		case 1:
			i, j := rapid.IntRange(0, len(out)-1).Draw(t, label+"DupAt"), rapid.IntRange(0, len(out)-1).Draw(t, label+"DupOf")
			out[i] = out[j]
		case 2:
			out[rapid.IntRange(0, len(out)-1).Draw(t, label+"OutAt")] = pool + rapid.IntRange(0, 3).Draw(t, label+"Out")
		case 3:
			out[rapid.IntRange(0, len(out)-1).Draw(t, label+"NegAt")] = -1 - rapid.IntRange(0, 3).Draw(t, label+"Neg")
		case 4: // a stretch of pages sent twice: a run overlapping another
			k := rapid.IntRange(1, len(out)).Draw(t, label+"StretchLen")
			i, j := rapid.IntRange(0, len(out)-k).Draw(t, label+"StretchAt"), rapid.IntRange(0, len(out)-k).Draw(t, label+"StretchOf")
			copy(out[i:i+k], out[j:j+k])
		}
	}
	return out
}

func sameErr(t *rapid.T, want, got error, what string) {
	if want == nil {
		require.NoError(t, got, what)
		return
	}
	require.Error(t, got, "%s: want %v", what, want)
	require.Equal(t, want.Error(), got.Error(), what)
	require.True(t, errors.Is(got, ErrBadInput), "%s: %v", what, got)
}

// TestCheckedRunsAgreesWithTheLists: the source side computed once and each
// destination's check fused with its runs give exactly what the plain
// check and the lists give (Owned, DstPages, Coalesce): the same runs, or
// the same error, for both CP rules, chunks anywhere in the request, lists
// of long and short runs and lists with a planted fault.
func TestCheckedRunsAgreesWithTheLists(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.IntRange(1, 3000).Draw(t, "total")
		start := rapid.IntRange(0, total-1).Draw(t, "start")
		n := rapid.IntRange(0, total-start).Draw(t, "n")
		size := rapid.IntRange(1, 4).Draw(t, "cp")
		c := CP{Size: size, Rank: rapid.IntRange(0, size-1).Draw(t, "rank"), Rule: Rule(rapid.IntRange(0, 1).Draw(t, "rule"))}
		srcPool := rapid.IntRange(n, n+100).Draw(t, "srcPool")
		src := drawPages(t, "src", n, srcPool)
		dstLen := rapid.IntRange(max(total-3, 0), total+3).Draw(t, "dstLen")
		dstPool := rapid.IntRange(max(dstLen-2, 0), dstLen+100).Draw(t, "dstPool")
		dst := drawPages(t, "dst", dstLen, dstPool)
		st, err := c.OwnedStride(len(src), start, total)
		require.NoError(t, err)

		wantErr := refCheck("source", src, srcPool)
		source, err := NewCheckedSource(src, start, st, srcPool)
		sameErr(t, wantErr, err, "source")
		if err != nil {
			return
		}
		require.Equal(t, st, source.Stride())

		owned, pos, err := c.Owned(src, start, total)
		require.NoError(t, err)
		var want []Run
		wantErr = refCheck("destination", dst, dstPool)
		if wantErr == nil {
			var mapped []int
			if mapped, wantErr = DstPages(dst, pos); wantErr == nil {
				want, wantErr = Coalesce(owned, mapped)
			}
		}
		got, err := source.CheckedRuns(dst, dstPool)
		sameErr(t, wantErr, err, "destination")
		if err != nil {
			return
		}
		if len(want) == 0 {
			require.Empty(t, got)
			return
		}
		require.Equal(t, want, got)
		require.Equal(t, len(got), cap(got), "runs allocated at their size")
	})
}

// TestCheckPagesNamesTheFirstBadPage: whichever way the list is checked
// (long runs, a word at a time; short runs, a page at a time), the error
// is the first bad page's, in index order.
func TestCheckPagesNamesTheFirstBadPage(t *testing.T) {
	long := seq(0, 1000) // one run: checked a run at a time
	for _, tc := range []struct {
		name  string
		pages []int
		want  string
	}{
		{"duplicate in a later run", append(append(seq(0, 200), seq(300, 100)...), seq(150, 10)...), "destination page 150 at index 300: duplicate"},
		{"out of pool before a duplicate", append(append(seq(0, 200), 1000), 5), "destination page 1000 at index 200: outside the pool of 1000 pages"},
		{"duplicate before out of pool", append(append(seq(0, 200), 5), 1000), "destination page 5 at index 200: duplicate"},
		{"negative", append(seq(0, 100), -1), "destination page -1 at index 100: outside the pool of 1000 pages"},
		{"run crossing the pool's end", seq(900, 200), "destination page 1000 at index 100: outside the pool of 1000 pages"},
		{"run overlapping a run", append(seq(100, 100), seq(50, 100)...), "destination page 100 at index 150: duplicate"},
		{"none", long, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := checkRuns("destination", tc.pages, 1000)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput))
			assert.Equal(t, tc.want, err.Error())
			assert.Equal(t, refCheck("destination", tc.pages, 1000).Error(), err.Error())
		})
	}
}

// A page sent again, alone or as the only repeated page at the start or
// the end of another run, is found wherever it falls in the bitmap's words.
func TestCheckPagesFindsEveryDuplicate(t *testing.T) {
	const pool = 600
	for p := 20; p < 200; p++ {
		for _, pages := range [][]int{
			append(seq(0, p+1), p),                         // alone
			append(seq(0, p+1), seq(p, 2)...),              // a run starting with it
			append(seq(0, p+1), seq(p, 70)...),             // a longer one
			append(seq(p, 200), seq(p-1, 2)...),            // a run ending with it
			append(seq(p, 200), seq(p-19, 20)...),          // a longer one
			append(append(seq(0, p+1), 400), seq(p, 3)...), // after another run
		} {
			want := refCheck("destination", pages, pool)
			require.Error(t, want)
			_, err := checkRuns("destination", pages, pool)
			require.Error(t, err, "page %d sent again in %v", p, pages)
			require.Equal(t, want.Error(), err.Error())
		}
	}
}

// The run starts and the bit extraction at word edges.
func TestRunStartsAndExtractBits(t *testing.T) {
	for _, n := range []int{1, 63, 64, 65, 128, 130} {
		pages := seq(0, n)
		for i := 3; i < n; i += 7 {
			pages[i] += 1000 // breaks a run at i and at i+1
		}
		starts := make([]uint64, (n+63)/64)
		runStarts(pages, starts)
		for i := range pages {
			want := i == 0 || pages[i] != pages[i-1]+1
			assert.Equal(t, want, starts[i>>6]&(1<<(i&63)) != 0, fmt.Sprintf("n %d page %d", n, i))
		}
		for from := 0; from < n; from += 5 {
			for m := 1; from+m <= n; m += 13 {
				got := extractBits(starts, from, m)
				require.Len(t, got, (m+63)/64)
				for k := 0; k < len(got)*64; k++ {
					want := k < m && starts[(from+k)>>6]&(1<<((from+k)&63)) != 0
					require.Equal(t, want, got[k>>6]&(1<<(k&63)) != 0, "n %d from %d m %d bit %d", n, from, m, k)
				}
			}
		}
	}
}

// refStarts is where the runs of pages start, written plainly.
func refStarts(pages []int) []uint64 {
	out := make([]uint64, (len(pages)+63)/64)
	for i := range pages {
		if i == 0 || pages[i] != pages[i-1]+1 {
			out[i>>6] |= 1 << (i & 63)
		}
	}
	return out
}

// shuffledRuns is pages lo..hi-1 in runs of runLen, the runs in a drawn
// order.
func shuffledRuns(t *rapid.T, label string, lo, hi, runLen int) []int {
	var out []int
	blocks := (hi - lo + runLen - 1) / runLen
	for _, b := range rapid.Permutation(seq(0, blocks)).Draw(t, label) {
		for p := lo + b*runLen; p < min(lo+(b+1)*runLen, hi); p++ {
			out = append(out, p)
		}
	}
	return out
}

// TestCheckRunsEitherWay: a list long enough for its head to decide how it
// is checked (short runs: page by page in the pass that finds the starts;
// long runs: a run at a time) gives the plain check's error, or the plain
// run starts, whichever way it went: a head of short runs and a tail of
// long ones or the other way round, the change before or after the
// probe's end, at times a planted fault.
func TestCheckRunsEitherWay(t *testing.T) {
	lens := []int{1, 2, 3, 5, 16, 64, 100, 1 << 20}
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 3*probePages+70).Draw(t, "n")
		at := rapid.IntRange(0, n).Draw(t, "at")
		pages := append(shuffledRuns(t, "head", 0, at, rapid.SampledFrom(lens).Draw(t, "headRun")),
			shuffledRuns(t, "tail", at, n, rapid.SampledFrom(lens).Draw(t, "tailRun"))...)
		pool := n + rapid.IntRange(0, 3).Draw(t, "spare")
		switch rapid.IntRange(0, 3).Draw(t, "fault") {
		case 1:
			pages[rapid.IntRange(0, n-1).Draw(t, "dupAt")] = pages[rapid.IntRange(0, n-1).Draw(t, "dupOf")]
		case 2:
			pages[rapid.IntRange(0, n-1).Draw(t, "outAt")] = pool + rapid.IntRange(-1, 2).Draw(t, "out")
		}
		want := refCheck("destination", pages, pool)
		got, err := checkRuns("destination", pages, pool)
		if want != nil {
			require.Error(t, err)
			require.Equal(t, want.Error(), err.Error())
			return
		}
		require.NoError(t, err)
		require.Equal(t, refStarts(pages), got)
	})
}

// wideRun is a Run with the int fields runs had before they were 32 bits.
type wideRun struct{ Src, Dst, Len int }

// wideCoalesce is Coalesce with wide runs, written plainly.
func wideCoalesce(src, dst []int) []wideRun {
	var runs []wideRun
	for i := range src {
		if n := len(runs); n > 0 && src[i] == runs[n-1].Src+runs[n-1].Len && dst[i] == runs[n-1].Dst+runs[n-1].Len {
			runs[n-1].Len++
			continue
		}
		runs = append(runs, wideRun{src[i], dst[i], 1})
	}
	return runs
}

// TestNarrowRunsAreTheWideOnes: the 32-bit runs of a checked chunk are the
// wide runs of the owned pages and their destination pages, field for
// field, and make the same blocks (the wide runs' blocks computed from
// their int fields), for both CP rules and lists of long and short runs.
func TestNarrowRunsAreTheWideOnes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.OneOf(rapid.IntRange(1, 3000), rapid.IntRange(2000, 3000)).Draw(t, "total")
		size := rapid.IntRange(1, 4).Draw(t, "cp")
		c := CP{Size: size, Rank: rapid.IntRange(0, size-1).Draw(t, "rank"), Rule: Rule(rapid.IntRange(0, 1).Draw(t, "rule"))}
		base := rapid.SampledFrom([]int{0, 1 << 20}).Draw(t, "base")
		runLen := rapid.OneOf(rapid.SampledFrom([]int{1, 2, 16, total}), rapid.IntRange(1, total))
		src := shuffledRuns(t, "src", base, base+total, runLen.Draw(t, "srcRun"))
		dst := shuffledRuns(t, "dst", base, base+total, runLen.Draw(t, "dstRun"))
		if rapid.Bool().Draw(t, "dstIsSrc") { // the source's runs, long ones included
			dst = slices.Clone(src)
		}
		st, err := c.OwnedStride(total, 0, total)
		require.NoError(t, err)
		source, err := NewCheckedSource(src, 0, st, base+total)
		require.NoError(t, err)
		got, err := source.CheckedRuns(dst, base+total)
		require.NoError(t, err)

		owned, pos, err := c.Owned(src, 0, total)
		require.NoError(t, err)
		mapped, err := DstPages(dst, pos)
		require.NoError(t, err)
		want := wideCoalesce(owned, mapped)
		require.Len(t, got, len(want))
		var wantBlocks []Block
		for i, w := range want {
			require.Equal(t, w, wideRun{int(got[i].Src), int(got[i].Dst), int(got[i].Len)}, "run %d", i)
			wantBlocks = append(wantBlocks, Block{Src: 1<<40 + uint64(w.Src)*4096, Dst: 1<<44 + uint64(w.Dst)*4096, Len: uint64(w.Len) * 4096})
		}
		require.Equal(t, wantBlocks, AppendBlocks(nil, got, 1<<40, 1<<44, 4096))
	})
}

// A run's first page must fit a Run's 32 bits (its length covers the
// pages after it): beyond, the runs are an error naming the page and its
// index, whichever way they are made.
func TestRunsBeyondMaxPage(t *testing.T) {
	const big = MaxPage + 1
	_, err := Coalesce([]int{0, big}, []int{5, 9})
	require.True(t, errors.Is(err, ErrBadInput))
	assert.EqualError(t, err, "source page 2147483648 at index 1: beyond the largest page index a run holds (2147483647)")
	_, err = Coalesce([]int{0, 1}, []int{5, -big - 1})
	assert.EqualError(t, err, "destination page -2147483649 at index 1: beyond the largest page index a run holds (2147483647)")
	runs, err := Coalesce([]int{MaxPage - 1, MaxPage, big}, []int{0, 1, 2})
	require.NoError(t, err)
	assert.Equal(t, []Run{{Src: MaxPage - 1, Dst: 0, Len: 3}}, runs)

	// Every other position (CP 2 shared-KV): Source.Runs.
	s, err := NewSource(seq(0, 8), 0, Stride{First: 0, Step: 2, N: 4})
	require.NoError(t, err)
	_, err = s.Runs([]int{0, 1, 2, 3, 10, 11, big, 13})
	assert.EqualError(t, err, "destination page 2147483648 at index 6: beyond the largest page index a run holds (2147483647)")
	s, err = NewSource([]int{0, 1, 2, 3, big, 5, 6, 7}, 0, Stride{First: 0, Step: 2, N: 4})
	require.NoError(t, err)
	_, err = s.Runs(seq(100, 8))
	assert.EqualError(t, err, "source page 2147483648 at index 4: beyond the largest page index a run holds (2147483647)")

	// Consecutive positions: the runs made from the list's run starts
	// (the pool's check left out: a pool that large is a 256 MB bitmap).
	s, err = NewSource(seq(0, 300), 0, Stride{First: 0, Step: 1, N: 300})
	require.NoError(t, err)
	dst := seq(0, 300)
	dst[200] = big
	starts := make([]uint64, (len(dst)+63)/64)
	runStarts(dst, starts)
	_, err = s.fillFrom(dst, starts)
	assert.EqualError(t, err, "destination page 2147483648 at index 200: beyond the largest page index a run holds (2147483647)")
}

// TestCheckRunsBadRunThenMore: a list of long runs whose second run leaves
// the pool, with more runs after it in later 64-page words, gets
// CheckPages's error; the check of runs went on from the bad run and read
// past its bitmap of the pool (a panic, on a goroutine of the plan's own
// where a chunk has many destinations).
func TestCheckRunsBadRunThenMore(t *testing.T) {
	var pages []int
	for p := 0; p < 64; p++ {
		pages = append(pages, p) // 0-63
	}
	for p := 150; p < 214; p++ {
		pages = append(pages, p) // 64-127: leaves the pool of 200 pages at index 114
	}
	for p := 64; p < 128; p++ {
		pages = append(pages, p) // 128-191
	}
	pages = append(pages, 130, 131) // 192-193
	want := CheckPages("destination", pages, 200)
	require.Error(t, want)
	var got error
	require.NotPanics(t, func() { _, got = checkRuns("destination", pages, 200) })
	require.EqualError(t, got, want.Error())
}
