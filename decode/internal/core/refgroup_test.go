package core

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/stretchr/testify/require"
)

// refGroupRoom is GroupRoom as it was before its decision became
// incremental: every report re-decided the room over all its chunks. It
// is the reference TestGroupRoomMatchesReference holds GroupRoom to.
type refGroupRoom struct {
	g          Group
	room       uint64
	totalPages int // 0 until known: Expected, or from the last chunk
	chunks     []*refGroupChunk
	last       *refGroupChunk
	err        error
	complete   bool
}

type refGroupChunk struct {
	rng     cp.Range
	reports map[int][]int // rank -> positions it reported, successful ones only
	// owned[rank] are the positions rank owns, once the rule can say:
	// computed once per chunk, not per report.
	owned [][]int
}

// newRefGroupRoom starts a room of a Group already validated.
func newRefGroupRoom(g Group, room uint64, totalPages int) *refGroupRoom {
	return &refGroupRoom{g: g, room: room, totalPages: totalPages}
}

// Verdict is the room's state; Err says why it failed.
func (r *refGroupRoom) Verdict() Verdict {
	switch {
	case r.err != nil:
		return Failed
	case r.complete:
		return Complete
	}
	return Waiting
}

// Err is why the room failed (marked ErrChunkFailed or ErrPrefillLost), or
// nil.
func (r *refGroupRoom) Err() error { return public(r.err) }

func (r *refGroupRoom) fail(err error) Verdict {
	if r.err == nil && !r.complete {
		r.err = err
	}
	return r.Verdict()
}

// Report records rank's notice of chunk c (status, positions, last) and
// returns the room's verdict after it. A report after the room ended
// changes nothing.
func (r *refGroupRoom) Report(rank int, c Chunk) Verdict {
	if r.Verdict() != Waiting {
		return r.Verdict()
	}
	where := func(format string, args ...any) error {
		return errors.Mark(errors.Newf("room %d chunk [%d, %d) rank %d: %s", r.room, c.Start, c.End, rank, errors.Newf(format, args...)), ErrChunkFailed)
	}
	if rank < 0 || rank >= r.g.Size {
		return r.fail(where("no such rank in a group of %d", r.g.Size))
	}
	if c.Status != messages.Succeeded {
		err := where("%s on the prefill: %s", c.Status, c.Err)
		if c.NotQuiesced {
			err = errors.Mark(err, ErrNotQuiesced)
		}
		return r.fail(err)
	}
	rng, err := cp.ChunkRange(c.Start, c.End, r.g.PageSize, c.Last)
	if err != nil {
		return r.fail(where("%v", err))
	}
	ch, err := r.chunk(rng)
	if err != nil {
		return r.fail(where("%v", err))
	}
	if _, dup := ch.reports[rank]; dup {
		return r.fail(where("reported twice"))
	}
	if c.Last {
		total := (rng.End + r.g.PageSize - 1) / r.g.PageSize
		if r.totalPages != 0 && r.totalPages != total {
			return r.fail(where("the last chunk ends at page %d, the room has %d pages", total, r.totalPages))
		}
		r.totalPages = total
	}
	// The owner rule lists a rank's positions in order; a rank may report
	// them in any.
	ch.reports[rank] = slices.Sorted(slices.Values(c.Positions))
	return r.decide()
}

// chunk finds or adds the chunk of rng; a range that overlaps another
// chunk's without being it is an error, as are a second last chunk and a
// chunk past the last.
func (r *refGroupRoom) chunk(rng cp.Range) (*refGroupChunk, error) {
	for _, ch := range r.chunks {
		if ch.rng.Start == rng.Start && ch.rng.End == rng.End {
			if ch.rng.Last != rng.Last {
				return nil, errors.Newf("another rank reported this chunk with last = %v", ch.rng.Last)
			}
			return ch, nil
		}
		if rng.Start < ch.rng.End && ch.rng.Start < rng.End {
			return nil, errors.Newf("overlaps chunk [%d, %d) another rank reported", ch.rng.Start, ch.rng.End)
		}
	}
	if rng.Last && r.last != nil {
		return nil, errors.Newf("a second last chunk (the first is [%d, %d))", r.last.rng.Start, r.last.rng.End)
	}
	if r.last != nil && rng.End > r.last.rng.End {
		return nil, errors.Newf("past the last chunk [%d, %d)", r.last.rng.Start, r.last.rng.End)
	}
	if rng.Last {
		furthest := 0
		for _, ch := range r.chunks {
			furthest = max(furthest, ch.rng.End)
		}
		if furthest > rng.End {
			return nil, errors.Newf("the last chunk, but chunks reported reach token %d", furthest)
		}
	}
	ch := &refGroupChunk{rng: rng, reports: map[int][]int{}}
	r.chunks = append(r.chunks, ch)
	if rng.Last {
		r.last = ch
	}
	return ch, nil
}

// owned returns the positions of chunk ch that rank owns, once the rule
// can say (the contiguous rule needs the request's page count, which does
// not change once known).
func (r *refGroupRoom) owned(ch *refGroupChunk, rank int) ([]int, bool) {
	if r.g.Rule == cp.Contiguous && r.totalPages == 0 {
		return nil, false
	}
	if ch.owned == nil {
		src := make([]int, ch.rng.Pages) // only the positions matter
		ch.owned = make([][]int, r.g.Size)
		for k := range r.g.Size {
			_, pos, err := (cp.CP{Size: r.g.Size, Rank: k, Rule: r.g.Rule}).Owned(src, ch.rng.PageStart, r.totalPages)
			if err != nil {
				ch.owned = nil
				return nil, false
			}
			ch.owned[k] = pos
		}
	}
	return ch.owned[rank], true
}

// decide checks every report it can against the owner rule and completes
// the room when nothing is missing.
func (r *refGroupRoom) decide() Verdict {
	missing := r.last == nil
	for _, ch := range r.chunks {
		for rank := range r.g.Size {
			want, known := r.owned(ch, rank)
			if !known {
				missing = true
				continue
			}
			got, reported := ch.reports[rank]
			switch {
			case reported && len(want) == 0:
				return r.fail(errors.Mark(errors.Newf("room %d chunk [%d, %d): rank %d reported it, but owns none of its pages", r.room, ch.rng.Start, ch.rng.End, rank), ErrChunkFailed))
			case reported && !slices.Equal(got, want):
				return r.fail(errors.Mark(errors.Newf("room %d chunk [%d, %d): rank %d reported positions %v, it owns %v", r.room, ch.rng.Start, ch.rng.End, rank, got, want), ErrChunkFailed))
			case !reported && len(want) > 0:
				missing = true
			}
		}
	}
	if missing {
		return Waiting
	}
	if !r.tiled() {
		return Waiting // a chunk in between is still to come
	}
	r.complete = true
	return Complete
}

// Owes reports whether the room still needs a report from rank: a chunk
// it owns pages of that it has not reported, or a chunk not yet seen.
func (r *refGroupRoom) Owes(rank int) bool {
	if r.Verdict() != Waiting {
		return false
	}
	if r.last == nil {
		return true
	}
	for _, ch := range r.chunks {
		want, known := r.owned(ch, rank)
		if _, reported := ch.reports[rank]; !reported && (!known || len(want) > 0) {
			return true
		}
	}
	// A chunk between those seen may still come, and rank may own pages of
	// it.
	return !r.tiled()
}

// tiled reports whether the chunks seen cover the request from token 0 to
// the last chunk's end without a gap.
func (r *refGroupRoom) tiled() bool {
	if r.last == nil {
		return false
	}
	sorted := slices.Clone(r.chunks)
	// Ties broken by the end: the sort alone left a chunk of no token that
	// starts where another starts before or after it as it came, and
	// "tiled" depended on which.
	slices.SortFunc(sorted, func(a, b *refGroupChunk) int {
		return cmp.Or(cmp.Compare(a.rng.Start, b.rng.Start), cmp.Compare(a.rng.End, b.rng.End))
	})
	next := 0
	for _, ch := range sorted {
		if ch.rng.Start != next {
			return false
		}
		next = ch.rng.End
	}
	return true
}

// Missing reports whether a chunk already seen has pages of rank that
// rank has not reported: what a rank that said goodbye can no longer send.
func (r *refGroupRoom) Missing(rank int) bool {
	if r.Verdict() != Waiting {
		return false
	}
	for _, ch := range r.chunks {
		want, known := r.owned(ch, rank)
		if _, reported := ch.reports[rank]; known && !reported && len(want) > 0 {
			return true
		}
	}
	return false
}

// Lost fails the room when it still needs rank: the rank's session went
// away (cause says how; the error is marked ErrPrefillLost). It returns the
// verdict after. Whether the rank's writes stopped is not the room's to
// say: the core marks its error ErrNotQuiesced unless the rank's access
// was revoked.
func (r *refGroupRoom) Lost(rank int, cause error) Verdict {
	if r.Owes(rank) {
		return r.fail(errors.Mark(errors.Wrapf(cause, "room %d: rank %d lost", r.room, rank), ErrPrefillLost))
	}
	return r.Verdict()
}

// TestGroupRoomMatchesReference: GroupRoom, which keeps its decision up
// to date report by report, decides as the reference that re-decided the
// whole room on every report: the same verdict and error after every
// report, and the same Owes and Missing for every rank, over random
// requests, chunkings, rules, orders and mistakes (wrong positions,
// duplicates, overlaps, chunks of no token, failures, lost ranks).
func TestGroupRoomMatchesReference(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for iter := range 20000 {
		matchReference(t, rnd, iter)
	}
}

// FuzzGroupRoomMatchesReference is TestGroupRoomMatchesReference with the
// fuzzer choosing the random room.
func FuzzGroupRoomMatchesReference(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Fuzz(func(t *testing.T, a, b uint64) { matchReference(t, rand.New(rand.NewPCG(a, b)), 0) })
}

// matchReference drives a GroupRoom and the reference with one random
// room's reports, and compares them after each.
func matchReference(t *testing.T, rnd *rand.Rand, iter int) {
	size := 1 + rnd.IntN(4)
	rule := cp.SharedKV
	if rnd.IntN(2) == 0 {
		rule = cp.Contiguous
	}
	page := 1 + rnd.IntN(4)
	pages := 1 + rnd.IntN(12)
	tokens := (pages-1)*page + 1 + rnd.IntN(page)
	total := 0
	if rnd.IntN(3) == 0 {
		total = pages
		if rnd.IntN(8) == 0 {
			total = 1 + rnd.IntN(12) // an Expected count the chunks disagree with
		}
	}
	g := Group{Size: size, Rule: rule, PageSize: page}
	got, ref := newGroupRoom(g, 7, total), newRefGroupRoom(g, 7, total)
	var reps []struct {
		rank int
		c    Chunk
	}
	add := func(rank int, c Chunk) {
		reps = append(reps, struct {
			rank int
			c    Chunk
		}{rank, c})
	}
	// An honest chunking: each rank reports the positions it owns.
	for start := 0; start < tokens; {
		end := min(tokens, start+page*(1+rnd.IntN(4)))
		last := end == tokens
		rng, err := cp.ChunkRange(start, end, page, last)
		require.NoError(t, err)
		for rank := range size {
			_, pos, err := (cp.CP{Size: size, Rank: rank, Rule: rule}).Owned(make([]int, rng.Pages), rng.PageStart, pages)
			require.NoError(t, err)
			if len(pos) > 0 || rnd.IntN(16) == 0 {
				add(rank, Chunk{Room: 7, Start: start, End: end, Last: last, Status: messages.Succeeded, Positions: pos})
			}
		}
		start = end
	}
	// Mistakes.
	for range rnd.IntN(3) {
		rank := rnd.IntN(size + 1)
		start := page * rnd.IntN(pages+1)
		end := start + rnd.IntN(3*page)
		c := Chunk{Room: 7, Start: start, End: end, Last: rnd.IntN(4) == 0, Status: messages.Succeeded}
		for range rnd.IntN(3) {
			c.Positions = append(c.Positions, rnd.IntN(pages+1))
		}
		if rnd.IntN(6) == 0 {
			c.Status, c.Err = messages.Failed, "link down"
		}
		add(rank, c)
	}
	if len(reps) > 0 && rnd.IntN(4) == 0 {
		add(reps[0].rank, reps[0].c) // a duplicate
	}
	rnd.Shuffle(len(reps), func(i, j int) { reps[i], reps[j] = reps[j], reps[i] })
	if rnd.IntN(2) == 0 {
		reps = reps[:rnd.IntN(len(reps)+1)] // some never come
	}
	for i, rp := range reps {
		where := fmt.Sprintf("iteration %d report %d (rank %d chunk [%d, %d) last %v positions %v)", iter, i, rp.rank, rp.c.Start, rp.c.End, rp.c.Last, rp.c.Positions)
		if rnd.IntN(32) == 0 {
			rank := rnd.IntN(size)
			require.Equal(t, ref.Lost(rank, errors.New("gone")), got.Lost(rank, errors.New("gone")), "lost rank %d before %s", rank, where)
		}
		require.Equal(t, ref.Report(rp.rank, rp.c), got.Report(rp.rank, rp.c), where)
		require.Equal(t, fmt.Sprint(ref.Err()), fmt.Sprint(got.Err()), where)
		for rank := range size {
			require.Equal(t, ref.Owes(rank), got.Owes(rank), "Owes(%d) after %s", rank, where)
			require.Equal(t, ref.Missing(rank), got.Missing(rank), "Missing(%d) after %s", rank, where)
		}
	}
}
