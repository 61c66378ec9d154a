package plan

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// bigFixture is a layout and two peers ("d", and "big" with a pool of
// twice the pages) for chunks large enough that destRuns spreads their
// destinations over several goroutines.
func bigFixture(t *testing.T, pages int) (*Layout, func(string) (*Peer, bool)) {
	t.Helper()
	l, err := NewLayout([]Buffer{{Name: "KV0", Base: 1 << 32, ItemLen: 16, Pages: pages}}, []rdma.LocalKey{1}, 1, 8, 1, cp.CP{Size: 1})
	require.NoError(t, err)
	mk := func(id string, n int) *Peer {
		return &Peer{ID: id, Address: []byte("a"), Buffers: []PeerBuffer{{Region: rdma.RegionDesc{Len: uint64(16 * n)}, ItemLen: 16}}}
	}
	d, big := mk("d", pages), mk("big", 2*pages)
	return l, func(id string) (*Peer, bool) {
		switch id {
		case "d":
			return d, true
		case "big":
			return big, true
		}
		return nil, false
	}
}

// shuffledRuns is a permutation of [0, n) in runs of run pages.
func shuffledRuns(n, run int, seed uint64) []int {
	blocks := rand.New(rand.NewPCG(seed, 7)).Perm((n + run - 1) / run)
	out := make([]int, 0, n)
	for _, b := range blocks {
		for p := b * run; p < min((b+1)*run, n); p++ {
			out = append(out, p)
		}
	}
	return out
}

// TestBuildPlanManyDestinationsAgrees: a chunk large enough to be planned
// on several goroutines gets, for every destination, the runs it would get
// alone; equal lists toward equal pools share one slice of runs (also when
// the first of them is not the chunk's first destination), and an equal
// list toward a pool of another size is planned on its own.
func TestBuildPlanManyDestinationsAgrees(t *testing.T) {
	defer goleak.VerifyNone(t)
	const n = 40_000 // 9 destinations: 360 000 pages, over parallelPages
	require.Greater(t, 9*n, parallelPages)
	l, peers := bigFixture(t, n)
	a, b := shuffledRuns(n, 1, 1), shuffledRuns(n, 16, 2)
	spec := &ChunkSpec{Room: 3, End: n, Last: true, SrcPages: shuffledRuns(n, 64, 4), TotalPages: n}
	for _, d := range []struct {
		peer  string
		pages []int
	}{{"d", a}, {"d", b}, {"d", slices.Clone(a)}, {"d", slices.Clone(b)}, {"big", slices.Clone(a)},
		{"d", seq(0, n)}, {"big", slices.Clone(a)}, {"d", slices.Clone(a)}, {"big", shuffledRuns(n, 3, 5)}} {
		spec.Infos = append(spec.Infos, DecodeInfo{Peer: d.peer, DstPages: d.pages})
	}
	p, err := BuildPlan(l, peers, spec, cp.EveryDestination)
	require.NoError(t, err)
	require.Len(t, p.Dests, len(spec.Infos))
	for i, d := range p.Dests {
		alone := *spec
		alone.Infos = spec.Infos[i : i+1]
		want, err := BuildPlan(l, peers, &alone, cp.EveryDestination)
		require.NoError(t, err)
		assert.Equal(t, i, d.Info)
		assert.Equal(t, want.Dests[0].Runs, d.Runs, "destination %d", i)
	}
	same := func(i, j int) bool { return &p.Dests[i].Runs[0] == &p.Dests[j].Runs[0] }
	assert.True(t, same(0, 2) && same(0, 7), "a's copies toward d share its runs")
	assert.True(t, same(1, 3), "b's copy shares its runs")
	assert.True(t, same(4, 6), "a's copies toward big share theirs")
	assert.False(t, same(0, 4), "a toward big: planned on its own")
	assert.False(t, same(0, 1) || same(0, 5) || same(4, 8), "different lists, their own runs")
}

// TestBuildPlanManyDestinationsFirstError: planned on several goroutines,
// the error is the first bad destination's in order, as one after the
// other would find it: a bad list before a short one, a short one before a
// later bad list.
func TestBuildPlanManyDestinationsFirstError(t *testing.T) {
	defer goleak.VerifyNone(t)
	const n = 40_000
	l, peers := bigFixture(t, n)
	good := shuffledRuns(n, 1, 5)
	dup := slices.Clone(good)
	dup[n-1] = dup[0] // a duplicate at the last index
	out := slices.Clone(good)
	out[7] = n + 5 // outside the pool
	infos := func(lists ...[]int) []DecodeInfo {
		var in []DecodeInfo
		for _, li := range lists {
			in = append(in, DecodeInfo{Peer: "d", DstPages: li})
		}
		return in
	}
	for _, tc := range []struct {
		name  string
		infos []DecodeInfo
		want  string
	}{
		{"duplicate first", infos(good, good, dup, good, out, good), "index 39999: duplicate"},
		{"outside first", infos(good, out, good, dup, good, good), "destination page 40005 at index 7: outside the pool"},
		{"bad list before a short one", infos(good, good, good, dup, good[:10], good), "index 39999: duplicate"},
		{"short one before a bad list", infos(good, good, good, good[:10], dup, good), "info 3: 10 destination pages for a request of 40000 pages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &ChunkSpec{Room: 4, End: n, Last: true, SrcPages: seq(0, n), TotalPages: n, Infos: tc.infos}
			_, err := BuildPlan(l, peers, spec, cp.EveryDestination)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func seq(from, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = from + i
	}
	return s
}

// TestDestRunPanicIsAnError: a panic while a destination's list is checked
// (a bug; here a source that is not there) is that destination's error, on
// the goroutines destRuns starts as on the caller's, and the plan fails
// rather than the process.
func TestDestRunPanicIsAnError(t *testing.T) {
	defer goleak.VerifyNone(t)
	pages := make([]int, parallelPages)
	for i := range pages {
		pages[i] = i
	}
	other := slices.Clone(pages)
	other[0], other[1] = 1, 0
	work := []destWork{{info: 0, pages: pages, capacity: len(pages)}, {info: 3, pages: other, capacity: len(pages)}}
	require.NotPanics(t, func() { destRuns(nil, work) })
	for _, w := range work {
		require.Error(t, w.err)
		assert.True(t, errors.IsAssertionFailure(w.err), "%v", w.err)
		assert.Contains(t, w.err.Error(), "panicked (a bug)")
		assert.Nil(t, w.runs)
		assert.Equal(t, -1, w.same)
	}
	assert.Contains(t, work[1].err.Error(), "info 3")
}
