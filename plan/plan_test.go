package plan

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixture: 3 MLA buffers of 64 pages, 2 hook layers (buffer 2 is the MTP
// layer), page size 4, and one decode peer of 32 pages.
func fixture(t *testing.T, c cp.CP) (*Layout, func(string) (*Peer, bool)) {
	t.Helper()
	bufs := []Buffer{
		{Name: "KV0", Base: 0x10000, ItemLen: 16, Pages: 64, Layer: 0},
		{Name: "KV1", Base: 0x20000, ItemLen: 16, Pages: 64, Layer: 1},
		{Name: "MTP", Base: 0x30000, ItemLen: 16, Pages: 64, Layer: 2},
	}
	l, err := NewLayout(bufs, []rdma.LocalKey{1, 2, 3}, 2, 8, 4, c)
	require.NoError(t, err)
	peer := &Peer{ID: "d0", Address: []byte("addr")}
	for range bufs {
		peer.Buffers = append(peer.Buffers, PeerBuffer{Region: rdma.RegionDesc{Addr: 0x90000, Len: 32 * 16}, ItemLen: 16})
	}
	require.NoError(t, ValidatePeer(l, *peer))
	return l, func(id string) (*Peer, bool) { return peer, id == peer.ID }
}

func TestLayoutGroupsAndHookless(t *testing.T) {
	l, _ := fixture(t, cp.CP{Size: 1})
	assert.Equal(t, []int{0, 1}, l.GroupBuffers(0), "K = 8 over 2 hook layers: one group")
	assert.Equal(t, []int{2}, l.Hookless(), "the MTP buffer fires no hook")
	assert.Equal(t, []int{0, 1, 2}, l.All())
	assert.Equal(t, 64, l.MinPages())
}

// TestBuildPlanChunkedCP checks a hand-computed plan: chunk [8, 24) of a
// 6-page request is pages 2..5; CP rank 1 of 2 (shared-KV rule) owns
// positions 3 and 5, which go to decode pages dst[3] = 13 and dst[5] = 15:
// not consecutive, so two runs.
func TestBuildPlanChunkedCP(t *testing.T) {
	l, peers := fixture(t, cp.CP{Rank: 1, Size: 2})
	spec := &ChunkSpec{Room: 9, Start: 8, End: 24, SrcPages: []int{40, 41, 42, 43}, TotalPages: 6,
		Infos: []DecodeInfo{{Peer: "d0", DstPages: []int{10, 11, 12, 13, 14, 15}}}}
	p, err := BuildPlan(l, peers, spec, cp.EveryDestination)
	require.NoError(t, err)
	assert.Equal(t, cp.PerLayer, p.Mode)
	assert.Equal(t, 2, p.Owned)
	require.Len(t, p.Dests, 1)
	assert.Equal(t, []cp.Run{{Src: 41, Dst: 13, Len: 1}, {Src: 43, Dst: 15, Len: 1}}, p.Dests[0].Runs)
	assert.Equal(t, uint64(3*16*2), p.Bytes(l), "3 buffers x 16 bytes x 2 owned pages")

	p, err = BuildPlan(l, peers, spec, cp.NoPerLayer)
	require.NoError(t, err)
	assert.Equal(t, cp.Monolithic, p.Mode)
	assert.Equal(t, cp.PerLayerOff, p.Reason)
}

func TestBuildPlanDestinations(t *testing.T) {
	l, peers := fixture(t, cp.CP{Size: 1})
	dst := []int{0, 1}
	spec := func(infos ...DecodeInfo) *ChunkSpec {
		return &ChunkSpec{Room: 1, Start: 0, End: 8, Last: true, SrcPages: []int{0, 1}, Infos: infos}
	}
	two := spec(DecodeInfo{Peer: "d0", DstPages: dst}, DecodeInfo{Peer: "d0", DstPages: []int{2, 3}})
	p, err := BuildPlan(l, peers, two, cp.EveryDestination)
	require.NoError(t, err)
	assert.Equal(t, cp.PerLayer, p.Mode, "two real destinations: per layer to both")
	assert.Equal(t, cp.SeveralDestinations, p.Reason)
	assert.Len(t, p.Dests, 2)

	p, err = BuildPlan(l, peers, two, cp.SingleDestination)
	require.NoError(t, err)
	assert.Equal(t, cp.Monolithic, p.Mode, "the reference rule: the monolithic send fans out")
	assert.Equal(t, cp.SeveralDestinations, p.Reason)
	assert.Len(t, p.Dests, 2)

	p, err = BuildPlan(l, peers, spec(DecodeInfo{Peer: "gone", Dummy: true}), cp.EveryDestination)
	require.NoError(t, err, "a dummy destination names no peer that must exist")
	assert.True(t, p.Empty(), "all-dummy destinations: nothing to send")
}

// TestBuildPlanEqualLists: destinations whose page lists are equal (the
// ranks of a decode TP group) get the runs each would get alone, and one
// whose list differs, or whose pool is smaller, is planned on its own: a
// page outside the smaller pool is still refused.
func TestBuildPlanEqualLists(t *testing.T) {
	l, peers := fixture(t, cp.CP{Size: 1})
	small := &Peer{ID: "small", Address: []byte("addr")}
	for range l.Buffers {
		small.Buffers = append(small.Buffers, PeerBuffer{Region: rdma.RegionDesc{Addr: 0x90000, Len: 4 * 16}, ItemLen: 16})
	}
	get := func(id string) (*Peer, bool) {
		if id == small.ID {
			return small, true
		}
		return peers(id)
	}
	spec := func(infos ...DecodeInfo) *ChunkSpec {
		return &ChunkSpec{Room: 1, Start: 0, End: 16, Last: true, SrcPages: []int{0, 1, 2, 3}, Infos: infos}
	}
	alone := func(dst []int) []cp.Run {
		p, err := BuildPlan(l, get, spec(DecodeInfo{Peer: "d0", DstPages: dst}), cp.EveryDestination)
		require.NoError(t, err)
		return p.Dests[0].Runs
	}
	a, b := []int{7, 8, 3, 4}, []int{5, 6, 7, 9}
	p, err := BuildPlan(l, get, spec(DecodeInfo{Peer: "d0", DstPages: a}, DecodeInfo{Peer: "d0", DstPages: b},
		DecodeInfo{Peer: "d0", DstPages: []int{7, 8, 3, 4}}), cp.EveryDestination)
	require.NoError(t, err)
	require.Len(t, p.Dests, 3)
	assert.Equal(t, alone(a), p.Dests[0].Runs)
	assert.Equal(t, alone(b), p.Dests[1].Runs)
	assert.Equal(t, alone(a), p.Dests[2].Runs)
	assert.Equal(t, 2, p.Dests[2].Info)

	_, err = BuildPlan(l, get, spec(DecodeInfo{Peer: "d0", DstPages: a}, DecodeInfo{Peer: "small", DstPages: []int{7, 8, 3, 4}}), cp.EveryDestination)
	require.True(t, errors.Is(err, ErrBadInput), "%v", err)
	assert.Contains(t, err.Error(), "destination page 7 at index 0: outside the pool of 4 pages")
}

// TestBuildPlanBadInput checks that every bad value is refused as bad input,
// and that the message names it.
func TestBuildPlanBadInput(t *testing.T) {
	l, peers := fixture(t, cp.CP{Size: 1})
	info := DecodeInfo{Peer: "d0", DstPages: []int{0, 1, 2, 3}}
	for _, tc := range []struct {
		name string
		spec ChunkSpec
		want string
	}{
		{"too few source pages", ChunkSpec{Room: 1, End: 16, Last: true, SrcPages: []int{0}, Infos: []DecodeInfo{info}}, "1 source pages, the range needs 4"},
		{"source page out of pool", ChunkSpec{Room: 1, End: 4, Last: true, SrcPages: []int{64}, Infos: []DecodeInfo{info}}, "source page 64 at index 0: outside the pool of 64 pages"},
		{"duplicate source page", ChunkSpec{Room: 1, End: 8, Last: true, SrcPages: []int{3, 3}, Infos: []DecodeInfo{info}}, "source page 3 at index 1: duplicate"},
		{"no destination", ChunkSpec{Room: 1, End: 4, Last: true, SrcPages: []int{0}}, "room 1: no decode info"},
		{"unknown peer", ChunkSpec{Room: 1, End: 4, Last: true, SrcPages: []int{0}, Infos: []DecodeInfo{{Peer: "x", DstPages: []int{0}}}}, `unknown peer "x"`},
		{"destination beyond the peer", ChunkSpec{Room: 1, End: 4, Last: true, SrcPages: []int{0}, Infos: []DecodeInfo{{Peer: "d0", DstPages: []int{32}}}}, "destination page 32 at index 0: outside the pool of 32 pages"},
		{"too few destination pages", ChunkSpec{Room: 1, End: 8, Last: true, SrcPages: []int{0, 1}, TotalPages: 2, Infos: []DecodeInfo{{Peer: "d0", DstPages: []int{0}}}}, "1 destination pages for a request of 2 pages"},
		{"chunk beyond the request", ChunkSpec{Room: 1, Start: 4, End: 12, Last: true, SrcPages: []int{0, 1}, TotalPages: 2, Infos: []DecodeInfo{info}}, "beyond the request's 2 pages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := BuildPlan(l, peers, &tc.spec, cp.EveryDestination)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestNewLayoutAndPeerBadInput(t *testing.T) {
	good := Buffer{Name: "KV0", Base: 0x1000, ItemLen: 16, Pages: 4}
	for _, tc := range []struct {
		name  string
		bufs  []Buffer
		pages int
		want  string
	}{
		{"no buffer", nil, 4, "no buffer"},
		{"zero item length", []Buffer{{Name: "K0", Base: 0x1000, Pages: 4}}, 4, "buffer 0 (K0): zero item length"},
		{"nil base", []Buffer{{Name: "K0", ItemLen: 16, Pages: 4}}, 4, "buffer 0 (K0): nil base address"},
		{"page size", []Buffer{good}, 0, "page size 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewLayout(tc.bufs, make([]rdma.LocalKey, len(tc.bufs)), 1, 8, tc.pages, cp.CP{Size: 1})
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	l, _ := fixture(t, cp.CP{Size: 1})
	pb := PeerBuffer{Region: rdma.RegionDesc{Addr: 0x1000, Len: 64}, ItemLen: 16}
	for _, tc := range []struct {
		name string
		peer Peer
		want string
	}{
		{"empty id", Peer{Address: []byte("a")}, "empty id"},
		{"no address", Peer{ID: "p"}, "empty transport address"},
		{"buffer count", Peer{ID: "p", Address: []byte("a"), Buffers: []PeerBuffer{pb}}, "has 1 buffers, the prefill layout 3"},
		{"item length", Peer{ID: "p", Address: []byte("a"), Buffers: []PeerBuffer{pb, pb, {Region: pb.Region, ItemLen: 8}}}, "buffer 2: item length 8, prefill 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidatePeer(l, tc.peer)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadInput), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// equalPages agrees with an element-wise compare: lengths, the last page,
// a shared backing array, empty and nil lists.
func TestEqualPages(t *testing.T) {
	a := []int{3, 1, 2, 1 << 40, -1}
	b := append([]int(nil), a...)
	assert.True(t, equalPages(a, b))
	assert.True(t, equalPages(a, a))
	assert.True(t, equalPages(nil, []int{}))
	assert.False(t, equalPages(a, a[:4]))
	b[4] = -2
	assert.False(t, equalPages(a, b))
	b[4], b[0] = -1, 4
	assert.False(t, equalPages(a, b))
	c := append([]int(nil), a...)
	c[3] = 1 << 41 // differs only in a high byte
	assert.False(t, equalPages(a, c))
}

// Clone shares no slice with the spec it copies; an info whose page list
// equals the one before it shares that one's copy.
func TestCloneSharesEqualLists(t *testing.T) {
	s := &ChunkSpec{Room: 1, End: 3, SrcPages: []int{0, 1, 2}, TotalPages: 3, Infos: []DecodeInfo{
		{Peer: "a", DstPages: []int{5, 6, 7}}, {Peer: "b", DstPages: []int{5, 6, 7}}, {Peer: "c", DstPages: []int{5, 6, 8}}, {Peer: "d", DstPages: []int{5, 6, 7}},
	}}
	c := s.Clone()
	require.Equal(t, s, c)
	assert.NotSame(t, &s.SrcPages[0], &c.SrcPages[0])
	for i := range s.Infos {
		assert.NotSame(t, &s.Infos[i].DstPages[0], &c.Infos[i].DstPages[0], "info %d", i)
	}
	assert.Same(t, &c.Infos[0].DstPages[0], &c.Infos[1].DstPages[0], "b equals a")
	assert.NotSame(t, &c.Infos[1].DstPages[0], &c.Infos[2].DstPages[0], "c differs")
	assert.NotSame(t, &c.Infos[2].DstPages[0], &c.Infos[3].DstPages[0], "d differs from c")
	s.Infos[1].DstPages[0] = 9 // the caller reusing its slices changes nothing kept
	assert.Equal(t, []int{5, 6, 7}, c.Infos[1].DstPages)
}

// CloneFor shares the copy of lists the plan found equal (their
// destinations took the same runs) and copies the rest: the result equals
// Clone's.
func TestCloneForSharesWhatThePlanFoundEqual(t *testing.T) {
	l, peers := fixture(t, cp.CP{Size: 1})
	s := &ChunkSpec{Room: 1, End: 16, Last: true, SrcPages: []int{0, 1, 2, 3}, Infos: []DecodeInfo{
		{Peer: "d0", DstPages: []int{7, 8, 3, 4}}, {Peer: "d0", DstPages: []int{7, 8, 3, 4}}, {Peer: "d0", DstPages: []int{5, 6, 7, 9}},
	}}
	p, err := BuildPlan(l, peers, s, cp.EveryDestination)
	require.NoError(t, err)
	require.Same(t, &p.Dests[0].Runs[0], &p.Dests[1].Runs[0], "the plan shares the equal lists' runs")
	c := s.CloneFor(p)
	require.Equal(t, s.Clone(), c)
	assert.Same(t, &c.Infos[0].DstPages[0], &c.Infos[1].DstPages[0])
	assert.NotSame(t, &c.Infos[1].DstPages[0], &c.Infos[2].DstPages[0])
	assert.NotSame(t, &s.Infos[0].DstPages[0], &c.Infos[0].DstPages[0])
}

// TestSamePool: a peer is the same pool as a copy of itself, and as no
// peer that differs in any field a decode session gives it.
func TestSamePool(t *testing.T) {
	base := func() Peer {
		return Peer{ID: "d", Address: []byte("ap-1"), Buffers: []PeerBuffer{
			{Region: rdma.RegionDesc{Addr: 4096, Len: 8192, Key: []byte{1, 2}}, ItemLen: 64},
			{Region: rdma.RegionDesc{Addr: 65536, Len: 8192, Key: []byte{3}}, ItemLen: 64},
		}}
	}
	p := base()
	same := base()
	require.True(t, p.SamePool(&same), "an equal copy")
	for name, mod := range map[string]func(*Peer){
		"id":        func(q *Peer) { q.ID = "e" },
		"address":   func(q *Peer) { q.Address = []byte("ap-2") },
		"a buffer":  func(q *Peer) { q.Buffers = q.Buffers[:1] },
		"an addr":   func(q *Peer) { q.Buffers[1].Region.Addr++ },
		"a length":  func(q *Peer) { q.Buffers[0].Region.Len-- },
		"a key":     func(q *Peer) { q.Buffers[1].Region.Key = []byte{4} },
		"item len":  func(q *Peer) { q.Buffers[0].ItemLen = 32 },
		"sharding":  func(q *Peer) { q.Sharding = &Sharding{Rank: reshard.Rank{TP: 1}} },
		"its stage": func(q *Peer) { q.Sharding = &Sharding{Side: reshard.Side{Stages: []int{2}}} },
	} {
		q := base()
		if name == "its stage" {
			p := base()
			p.Sharding = &Sharding{Side: reshard.Side{Stages: []int{1}}}
			mod(&q)
			require.False(t, p.SamePool(&q), name)
			continue
		}
		mod(&q)
		require.False(t, p.SamePool(&q), name)
		require.False(t, q.SamePool(&p), name)
	}
}
