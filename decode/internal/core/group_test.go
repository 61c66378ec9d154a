package core

import (
	"errors"
	"testing"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rep is one rank's report in a table: chunk [start, end) of a 100-token
// request (7 pages of 16 tokens), successful unless failed.
type rep struct {
	rank       int
	start, end int
	pos        []int
	failed     bool
	lost       bool // the rank's session is lost instead of reporting
}

func (r rep) chunk() Chunk {
	c := Chunk{Room: 7, Start: r.start, End: r.end, Last: r.end == 100, Status: messages.Succeeded, Positions: r.pos, DstPages: r.pos}
	if r.failed {
		c.Status, c.Err = messages.Failed, "link down"
	}
	return c
}

// TestGroupRoomDecides: a CP group's room is complete only when every rank
// owning pages of every chunk reported exactly its pages successfully; a
// failed, foreign, duplicate or wrong report, or a needed rank lost, fails
// it; anything missing keeps it waiting. Request: 100 tokens, 7 pages,
// chunks [0, 64) (pages 0-3) and [64, 100) (pages 4-6, the last).
func TestGroupRoomDecides(t *testing.T) {
	// Shared-KV over 4 ranks: page p is rank p%4's; rank 3 owns none of
	// the last chunk.
	shared := []rep{{rank: 0, start: 0, end: 64, pos: []int{0}}, {rank: 1, start: 0, end: 64, pos: []int{1}},
		{rank: 2, start: 0, end: 64, pos: []int{2}}, {rank: 3, start: 0, end: 64, pos: []int{3}},
		{rank: 0, start: 64, end: 100, pos: []int{4}}, {rank: 1, start: 64, end: 100, pos: []int{5}},
		{rank: 2, start: 64, end: 100, pos: []int{6}}}
	// Contiguous over 4 ranks: [0,2) [2,4) [4,6) [6,7).
	contiguous := []rep{{rank: 0, start: 0, end: 64, pos: []int{0, 1}}, {rank: 1, start: 0, end: 64, pos: []int{2, 3}},
		{rank: 2, start: 64, end: 100, pos: []int{4, 5}}, {rank: 3, start: 64, end: 100, pos: []int{6}}}
	with := func(base []rep, extra ...rep) []rep { return append(append([]rep{}, base...), extra...) }
	without := func(base []rep, i int) []rep { return append(append([]rep{}, base[:i]...), base[i+1:]...) }
	reversed := func(base []rep) []rep {
		out := make([]rep, len(base))
		for i, r := range base {
			out[len(base)-1-i] = r
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		rule    cp.Rule
		total   int // Expected pages; 0: learnt from the last chunk
		reports []rep
		want    Verdict
		mark    error // the failure's class
		why     string
	}{
		{name: "shared: all owners", rule: cp.SharedKV, reports: shared, want: Complete},
		{name: "shared: any order", rule: cp.SharedKV, reports: reversed(shared), want: Complete},
		{name: "shared: expected pages", rule: cp.SharedKV, total: 7, reports: shared, want: Complete},
		{name: "shared: a rank missing from chunk 0", rule: cp.SharedKV, reports: without(shared, 3), want: Waiting},
		{name: "shared: a rank missing from the last chunk", rule: cp.SharedKV, reports: without(shared, 6), want: Waiting},
		{name: "shared: no last chunk yet", rule: cp.SharedKV, reports: shared[:4], want: Waiting},
		{name: "shared: the first chunk never came", rule: cp.SharedKV, reports: shared[4:], want: Waiting},
		{name: "shared: a rank outside the owners reports", rule: cp.SharedKV,
			reports: with(shared[:6], rep{rank: 3, start: 64, end: 100}), want: Failed, mark: ErrChunkFailed, why: "owns none of its pages"},
		{name: "shared: a chunk past the last", rule: cp.SharedKV,
			reports: with(shared[:6], rep{rank: 3, start: 112, end: 128, pos: []int{7}}), want: Failed, mark: ErrChunkFailed, why: "past the last chunk [64, 100)"},
		{name: "shared: the last chunk before one reported", rule: cp.SharedKV,
			reports: with(shared[:4], rep{rank: 3, start: 112, end: 128, pos: []int{7}}, shared[4]), want: Failed, mark: ErrChunkFailed, why: "chunks reported reach token 128"},
		{name: "shared: a failed rank", rule: cp.SharedKV,
			reports: with(shared[:2], rep{rank: 2, start: 0, end: 64, pos: []int{2}, failed: true}), want: Failed, mark: ErrChunkFailed, why: "link down"},
		{name: "shared: a failed rank after the others succeeded", rule: cp.SharedKV,
			reports: with(without(shared, 6), rep{rank: 2, start: 64, end: 100, pos: []int{6}, failed: true}), want: Failed, mark: ErrChunkFailed},
		{name: "shared: wrong positions", rule: cp.SharedKV,
			reports: with(shared[:1], rep{rank: 1, start: 0, end: 64, pos: []int{2}}), want: Failed, mark: ErrChunkFailed, why: "it owns [1]"},
		{name: "shared: a page missing from a report", rule: cp.SharedKV,
			reports: []rep{{rank: 0, start: 0, end: 64, pos: nil}}, want: Failed, mark: ErrChunkFailed},
		{name: "shared: twice", rule: cp.SharedKV, reports: with(shared[:1], shared[0]), want: Failed, mark: ErrChunkFailed, why: "twice"},
		{name: "shared: no such rank", rule: cp.SharedKV, reports: []rep{{rank: 4, start: 0, end: 64, pos: []int{4}}}, want: Failed, mark: ErrChunkFailed},
		{name: "shared: overlapping chunks", rule: cp.SharedKV,
			reports: with(shared[:1], rep{rank: 1, start: 0, end: 32, pos: []int{1}}), want: Failed, mark: ErrChunkFailed, why: "overlaps"},
		{name: "shared: last chunk disagrees with the expected pages", rule: cp.SharedKV, total: 9, reports: shared, want: Failed, mark: ErrChunkFailed},
		{name: "shared: an owner lost", rule: cp.SharedKV, reports: with(shared[:5], rep{rank: 2, lost: true}), want: Failed, mark: ErrPrefillLost},
		{name: "shared: a rank lost that owes nothing more", rule: cp.SharedKV,
			reports: with(shared[:6], rep{rank: 3, lost: true}), want: Waiting},
		{name: "shared: and then the last owner", rule: cp.SharedKV,
			reports: with(shared[:6], rep{rank: 3, lost: true}, shared[6]), want: Complete},
		{name: "shared: lost before any report", rule: cp.SharedKV, reports: []rep{{rank: 1, lost: true}}, want: Failed, mark: ErrPrefillLost},
		{name: "contiguous: all owners", rule: cp.Contiguous, reports: contiguous, want: Complete},
		{name: "contiguous: any order", rule: cp.Contiguous, reports: reversed(contiguous), want: Complete},
		{name: "contiguous: owner missing", rule: cp.Contiguous, reports: contiguous[1:], want: Waiting},
		{name: "contiguous: a rank outside the owners", rule: cp.Contiguous,
			reports: with(contiguous[:3], rep{rank: 3, start: 0, end: 64}), want: Failed, mark: ErrChunkFailed, why: "owns none"},
		{name: "contiguous: outside the owners, found when the last chunk says the size", rule: cp.Contiguous,
			reports: []rep{{rank: 2, start: 0, end: 64}, contiguous[3]}, want: Failed, mark: ErrChunkFailed, why: "owns none"},
		{name: "contiguous: expected size checks early", rule: cp.Contiguous, total: 7,
			reports: []rep{{rank: 2, start: 0, end: 64}}, want: Failed, mark: ErrChunkFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewGroupRoom(Group{Size: 4, Rule: tc.rule, PageSize: 16}, 7, tc.total)
			require.NoError(t, err)
			var v Verdict
			for _, rp := range tc.reports {
				if rp.lost {
					v = r.Lost(rp.rank, errors.Join(ErrPrefillLost, errors.New("session lost")))
				} else {
					v = r.Report(rp.rank, rp.chunk())
				}
			}
			assert.Equal(t, tc.want, v, "%v", r.Err())
			assert.Equal(t, tc.want, r.Verdict())
			if tc.mark != nil {
				require.Error(t, r.Err())
				assert.ErrorIs(t, r.Err(), tc.mark)
				assert.Contains(t, r.Err().Error(), tc.why)
			} else {
				assert.NoError(t, r.Err())
			}
		})
	}
}

// TestGroupRoomEndsOnce: after its verdict, a room ignores later reports.
func TestGroupRoomEndsOnce(t *testing.T) {
	r, err := NewGroupRoom(Group{Size: 1, PageSize: 16}, 1, 0)
	require.NoError(t, err)
	c := Chunk{Start: 0, End: 20, Last: true, Status: messages.Succeeded, Positions: []int{0, 1}}
	assert.Equal(t, Complete, r.Report(0, c))
	assert.Equal(t, Complete, r.Report(0, Chunk{Start: 0, End: 20, Last: true, Status: messages.Failed}))
	assert.Equal(t, Complete, r.Lost(0, ErrPrefillLost))
	assert.False(t, r.Owes(0))
}

func TestGroupValidates(t *testing.T) {
	for _, g := range []Group{{Size: 0, PageSize: 16}, {Size: 4}, {Size: MaxGroupSize + 1, PageSize: 1}, {Size: 2, PageSize: 1, Rule: 9}} {
		_, err := NewGroupRoom(g, 1, 0)
		assert.ErrorIs(t, err, ErrBadInput, "%+v", g)
	}
}

// BenchmarkGroupRoom: the decision's cost per report, for a request of 512
// pages in 8 chunks from 8 shared-KV ranks (64 reports a room).
func BenchmarkGroupRoom(b *testing.B) {
	const size, page, pages, chunks = 8, 16, 512, 8
	per := pages / chunks
	var reports []struct {
		rank int
		c    Chunk
	}
	for ch := range chunks {
		for rank := range size {
			c := Chunk{Start: ch * per * page, End: (ch + 1) * per * page, Last: ch == chunks-1, Status: messages.Succeeded}
			for p := ch * per; p < (ch+1)*per; p++ {
				if p%size == rank {
					c.Positions = append(c.Positions, p)
				}
			}
			reports = append(reports, struct {
				rank int
				c    Chunk
			}{rank, c})
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		r, _ := NewGroupRoom(Group{Size: size, PageSize: page}, 1, 0)
		for _, rp := range reports {
			r.Report(rp.rank, rp.c)
		}
		if r.Verdict() != Complete {
			b.Fatal(r.Err())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(reports)), "ns/report")
}
