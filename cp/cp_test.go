package cp

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestChunkRange(t *testing.T) {
	for _, tc := range []struct {
		name           string
		start, end, ps int
		last           bool
		want           Range
		err            string
	}{
		{name: "single whole chunk", start: 0, end: 100, ps: 16, last: true,
			want: Range{Start: 0, End: 100, PageStart: 0, Pages: 7, Last: true}},
		{name: "non-last floors end", start: 0, end: 100, ps: 16,
			want: Range{Start: 0, End: 96, PageStart: 0, Pages: 6}},
		{name: "second chunk starts at its page", start: 96, end: 200, ps: 16,
			want: Range{Start: 96, End: 192, PageStart: 6, Pages: 6}},
		{name: "non-last shorter than a page is empty", start: 32, end: 40, ps: 16,
			want: Range{Start: 32, End: 32, PageStart: 2, Pages: 0}},
		{name: "page size one", start: 5, end: 9, ps: 1,
			want: Range{Start: 5, End: 9, PageStart: 5, Pages: 4}},
		{name: "unaligned start", start: 5, end: 40, ps: 16, err: "chunk start 5: not aligned to page size 16"},
		{name: "end before start", start: 32, end: 16, ps: 16, err: "chunk end 16 before start 32"},
		{name: "zero page size", start: 0, end: 16, ps: 0, err: "page size 0"},
		{name: "negative start", start: -16, end: 16, ps: 16, err: "chunk start -16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChunkRange(tc.start, tc.end, tc.ps, tc.last)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				assert.True(t, errors.Is(err, ErrBadInput))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestOwnedShared(t *testing.T) {
	src := []int{10, 11, 12, 13, 14, 15}
	for _, tc := range []struct {
		name       string
		pageStart  int
		cp, rank   int
		owned, pos []int
	}{
		{name: "cp1 owns all", pageStart: 0, cp: 1, rank: 0, owned: src, pos: []int{0, 1, 2, 3, 4, 5}},
		{name: "rank0 of 4 from 0", pageStart: 0, cp: 4, rank: 0, owned: []int{10, 14}, pos: []int{0, 4}},
		{name: "rank3 of 4 from 0", pageStart: 0, cp: 4, rank: 3, owned: []int{13}, pos: []int{3}},
		// Chunk 1 starts at absolute page 6: rank 0 owns positions 8 and 12
		// there, not 0 and 4 (the chunk-local bug of the commit log).
		{name: "rank0 of 4 from 6", pageStart: 6, cp: 4, rank: 0, owned: []int{12}, pos: []int{8}},
		{name: "rank2 of 4 from 6", pageStart: 6, cp: 4, rank: 2, owned: []int{10, 14}, pos: []int{6, 10}},
		{name: "more ranks than pages", pageStart: 0, cp: 8, rank: 7, owned: []int{}, pos: []int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owned, pos, err := OwnedShared(src, tc.pageStart, tc.cp, tc.rank)
			require.NoError(t, err)
			assert.Equal(t, tc.owned, owned)
			assert.Equal(t, tc.pos, pos)
		})
	}
}

func TestContiguousSlice(t *testing.T) {
	// T=10, cp=4: base 2, rem 2: [0,3) [3,6) [6,8) [8,10).
	want := [][2]int{{0, 3}, {3, 6}, {6, 8}, {8, 10}}
	for r, w := range want {
		lo, hi, err := ContiguousSlice(10, 4, r)
		require.NoError(t, err)
		assert.Equal(t, w, [2]int{lo, hi}, "rank %d", r)
	}
}

func TestOwnedContiguousClipsToChunk(t *testing.T) {
	// Request of 10 pages, cp=4; the chunk covers positions [4, 9).
	src := []int{40, 41, 42, 43, 44}
	owned, pos, err := OwnedContiguous(src, 4, 10, 4, 1) // rank 1 owns [3,6)
	require.NoError(t, err)
	assert.Equal(t, []int{40, 41}, owned)
	assert.Equal(t, []int{4, 5}, pos)
	owned, pos, err = OwnedContiguous(src, 4, 10, 4, 0) // rank 0 owns [0,3): nothing here
	require.NoError(t, err)
	assert.Empty(t, owned)
	assert.Empty(t, pos)
	_, _, err = OwnedContiguous(src, 8, 10, 4, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "chunk pages [8, 13) beyond the request's 10 pages")
}

func TestCPValidate(t *testing.T) {
	for _, tc := range []struct {
		cp  CP
		err string
	}{
		{CP{Size: 0}, "CP size 0"},
		{CP{Size: 4, Rank: 4}, "CP rank 4: must be in [0, 4)"},
		{CP{Size: 4, Rank: -1}, "CP rank -1"},
		{CP{Size: 2, Rule: 7}, "CP rule 7"},
	} {
		err := tc.cp.Validate()
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.err)
		assert.True(t, errors.Is(err, ErrBadInput))
	}
	_, err := ParseRule("diagonal")
	require.ErrorContains(t, err, `CP rule "diagonal"`)
}

func TestDstPagesNamesOutOfRange(t *testing.T) {
	got, err := DstPages([]int{7, 8, 9}, []int{2, 0})
	require.NoError(t, err)
	assert.Equal(t, []int{9, 7}, got)

	_, err = DstPages([]int{7, 8, 9}, []int{1, 3, 5})
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrBadInput))
	assert.Contains(t, err.Error(), "position 3 (and 1 more) beyond the destination page list of 3 pages")
}

func TestCoalesce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst []int
		want     []Run
	}{
		{name: "empty", want: nil},
		{name: "one run", src: []int{4, 5, 6}, dst: []int{10, 11, 12}, want: []Run{{4, 10, 3}}},
		{name: "src breaks", src: []int{4, 5, 7}, dst: []int{10, 11, 12}, want: []Run{{4, 10, 2}, {7, 12, 1}}},
		{name: "dst breaks", src: []int{4, 5, 6}, dst: []int{10, 11, 20}, want: []Run{{4, 10, 2}, {6, 20, 1}}},
		{name: "descending never merges", src: []int{3, 2, 1}, dst: []int{3, 2, 1}, want: []Run{{3, 3, 1}, {2, 2, 1}, {1, 1, 1}}},
		{name: "stride of shared CP", src: []int{0, 4, 8}, dst: []int{1, 2, 3}, want: []Run{{0, 1, 1}, {4, 2, 1}, {8, 3, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Coalesce(tc.src, tc.dst)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := Coalesce([]int{1}, nil)
	require.ErrorContains(t, err, "1 source pages but 0 destination pages")
}

func TestAppendBlocksIdenticalRunsPerBuffer(t *testing.T) {
	runs := []Run{{Src: 2, Dst: 5, Len: 3}, {Src: 9, Dst: 0, Len: 1}}
	k := AppendBlocks(nil, runs, 1000, 5000, 64)
	v := AppendBlocks(nil, runs, 9000, 7000, 64)
	assert.Equal(t, []Block{{1000 + 128, 5000 + 320, 192}, {1000 + 576, 5000, 64}}, k)
	require.Len(t, v, len(k))
	for i := range k {
		// Same page geometry in every buffer: only the bases differ.
		assert.Equal(t, k[i].Len, v[i].Len)
		assert.Equal(t, k[i].Src-1000, v[i].Src-9000)
		assert.Equal(t, k[i].Dst-5000, v[i].Dst-7000)
	}
}

func TestGuard(t *testing.T) {
	for _, tc := range []struct {
		dummy  []bool
		policy Policy
		mode   Mode
		reason Reason
		real   int
	}{
		{[]bool{true, false, true}, EveryDestination, PerLayer, OneDestination, 1},
		{[]bool{true, false, true}, SingleDestination, PerLayer, OneDestination, 1},
		{[]bool{true, false, true}, NoPerLayer, Monolithic, PerLayerOff, 1},
		{[]bool{false, false}, EveryDestination, PerLayer, SeveralDestinations, -1},
		{[]bool{false, false}, SingleDestination, Monolithic, SeveralDestinations, -1},
		{[]bool{false, false}, NoPerLayer, Monolithic, PerLayerOff, -1},
		{[]bool{true, true}, EveryDestination, Monolithic, AllDummy, -1},
		{[]bool{true, true}, SingleDestination, Monolithic, AllDummy, -1},
		{[]bool{true, true}, NoPerLayer, Monolithic, AllDummy, -1},
		{nil, EveryDestination, Monolithic, AllDummy, -1},
	} {
		m, r, i := Guard(tc.dummy, tc.policy)
		assert.Equal(t, tc.mode, m, "%v %v", tc.dummy, tc.policy)
		assert.Equal(t, tc.reason, r, "%v %v", tc.dummy, tc.policy)
		assert.Equal(t, tc.real, i, "%v %v", tc.dummy, tc.policy)
	}
}

func TestGroups(t *testing.T) {
	g, err := NewGroups(78, 8)
	require.NoError(t, err)
	assert.Equal(t, 10, g.Count())
	var boundaries []int
	for l := 0; l < 78; l++ {
		if g.Boundary(l) {
			boundaries = append(boundaries, l)
		}
	}
	assert.Equal(t, []int{7, 15, 23, 31, 39, 47, 55, 63, 71, 77}, boundaries)
	lo, hi := g.Layers(9)
	assert.Equal(t, [2]int{72, 78}, [2]int{lo, hi}, "last group is partial")
	assert.Equal(t, 9, g.Of(77))
	_, err = NewGroups(78, 0)
	require.ErrorContains(t, err, "group size 0")
}

// TestChunkUnionIsWholeRequest is the commit log's mapping invariant: for every
// CP rank and rule, sending chunk by chunk with absolute positions writes
// exactly what one whole-request send writes.
func TestChunkUnionIsWholeRequest(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ps := rapid.IntRange(1, 16).Draw(t, "pageSize")
		tokens := rapid.IntRange(1, 400).Draw(t, "tokens")
		size := rapid.IntRange(1, 8).Draw(t, "cp")
		rule := Rule(rapid.IntRange(0, 1).Draw(t, "rule"))
		totalPages := (tokens + ps - 1) / ps
		src := rapid.Permutation(seq(1000, totalPages)).Draw(t, "src")
		dst := rapid.Permutation(seq(0, totalPages)).Draw(t, "dst")
		chunks := rapid.IntRange(1, 4).Draw(t, "chunks")

		for rank := 0; rank < size; rank++ {
			c := CP{Size: size, Rank: rank, Rule: rule}
			whole := map[int]int{}
			wo, wp, err := c.Owned(src, 0, totalPages)
			require.NoError(t, err)
			wd, err := DstPages(dst, wp)
			require.NoError(t, err)
			for i := range wo {
				whole[wo[i]] = wd[i]
			}

			got := map[int]int{}
			start := 0
			for k := 0; k < chunks; k++ {
				last := k == chunks-1
				end := tokens
				if !last {
					end = start + rapid.IntRange(0, tokens-start).Draw(t, "chunkLen")
				}
				r, err := ChunkRange(start, end, ps, last)
				require.NoError(t, err)
				o, p, err := c.Owned(src[r.PageStart:r.PageStart+r.Pages], r.PageStart, totalPages)
				require.NoError(t, err)
				d, err := DstPages(dst, p)
				require.NoError(t, err)
				for i := range o {
					_, dup := got[o[i]]
					require.False(t, dup, "page %d sent by two chunks", o[i])
					got[o[i]] = d[i]
				}
				start = r.End
			}
			require.Equal(t, whole, got, "rank %d", rank)
		}
	})
}

// TestSharedRanksPartition: across ranks, every position is owned exactly once.
func TestRanksPartitionPositions(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		size := rapid.IntRange(1, 8).Draw(t, "cp")
		total := rapid.IntRange(0, 200).Draw(t, "pages")
		start := rapid.IntRange(0, total).Draw(t, "start")
		n := rapid.IntRange(0, total-start).Draw(t, "n")
		rule := Rule(rapid.IntRange(0, 1).Draw(t, "rule"))
		src := seq(start, n)
		seen := make(map[int]int)
		for rank := 0; rank < size; rank++ {
			_, pos, err := CP{Size: size, Rank: rank, Rule: rule}.Owned(src, start, total)
			require.NoError(t, err)
			for _, p := range pos {
				seen[p]++
			}
		}
		require.Len(t, seen, n)
		for p, c := range seen {
			require.Equal(t, 1, c, "position %d", p)
		}
	})
}

func TestCoalesceRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 64).Draw(t, "n")
		src := rapid.SliceOfN(rapid.IntRange(0, 40), n, n).Draw(t, "src")
		dst := rapid.SliceOfN(rapid.IntRange(0, 40), n, n).Draw(t, "dst")
		runs, err := Coalesce(src, dst)
		require.NoError(t, err)
		require.Equal(t, n, Pages(runs))
		i := 0
		for j, r := range runs {
			require.Positive(t, r.Len)
			for k := range int(r.Len) {
				require.Equal(t, src[i], int(r.Src)+k)
				require.Equal(t, dst[i], int(r.Dst)+k)
				i++
			}
			if j > 0 { // maximal: the previous run could not have been extended
				p := runs[j-1]
				require.False(t, r.Src == p.Src+p.Len && r.Dst == p.Dst+p.Len)
			}
		}
	})
}

func seq(from, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = from + i
	}
	return s
}
