package core

import (
	"cmp"
	"slices"
	"sort"
	"strconv"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
)

// RankKey is the session metadata key (DialConfig.Metadata) that carries a
// prefill session's CP rank when the server serves a CP group
// (Config.Group): every notice of the session is that rank's report.
const RankKey = "kvstream-cp-rank"

// Group says that every room is written by the ranks of one
// context-parallel group, each over its own prefill session: a chunk is
// complete only when every rank that owns at least one of its pages
// reported it successful and its pages landed.
type Group struct {
	Size     int     // ranks in the group (1 to MaxGroupSize)
	Rule     cp.Rule // how the ranks split a request's pages
	PageSize int     // tokens per page: maps a chunk's tokens to its pages
}

// MaxGroupSize bounds Group.Size: a group's ranks are tracked per chunk.
const MaxGroupSize = 1024

// CheckGroup says why g cannot be a Server's group (an error marked
// ErrBadInput), or nil.
func CheckGroup(g Group) error {
	switch {
	case g.Size < 1 || g.Size > MaxGroupSize:
		return BadInput("Group.Size %d: want 1 to %d", g.Size, MaxGroupSize)
	case g.PageSize < 1:
		return BadInput("Group.PageSize %d: must be positive", g.PageSize)
	}
	return errors.Wrap((cp.CP{Size: g.Size, Rule: g.Rule}).Validate(), "Group")
}

// Verdict is a group room's state.
type Verdict int

const (
	// Waiting: no rank failed, and some chunk or some rank's report is
	// still missing.
	Waiting Verdict = iota
	// Complete: the chunks tile the request up to its last chunk, and
	// every chunk was reported successful by exactly the ranks owning its
	// pages, each with exactly its pages.
	Complete
	// Failed: a rank failed a chunk, a rank reported what it does not own,
	// or a rank the room needs was lost.
	Failed
)

func (v Verdict) String() string {
	switch v {
	case Waiting:
		return "waiting"
	case Complete:
		return "complete"
	case Failed:
		return "failed"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// GroupRoom decides, from the ranks' reports alone, whether a room written
// by a CP group is complete, failed or still waiting. It does no I/O and
// holds no lock: the core calls it for every room, and tests drive it
// with tables. The zero value is not usable: NewGroupRoom.
//
// A report costs the same however many chunks the room holds (a peer
// chooses how many it reports): the decision is kept up to date, report
// by report, in counts, and is redone over every chunk only once, when
// the last chunk tells the contiguous rule the request's page count.
type GroupRoom struct {
	g          Group
	room       uint64
	totalPages int           // 0 until known: Expected, or from the last chunk
	chunks     []*groupChunk // in the order they were first reported
	last       *groupChunk
	err        error
	complete   bool

	byRange map[[2]int]*groupChunk // by token range
	// spans are the chunks of at least one token, by start (they do not
	// overlap), empties those of no token: indexes in chunks, which move
	// without the write barriers of pointers when one is inserted.
	spans   []int
	empties []int
	covered int // tokens the chunks cover
	maxEnd  int // the end of the chunk that ends last
	// unknown: chunks whose owners the rule cannot say yet; per rank:
	// unknownBy, those of them the rank reported; missing, the chunks
	// whose owners are known where the rank owns pages it did not report
	// (missingAll: their sum over the ranks).
	unknown    int
	unknownBy  []int
	missing    []int
	missingAll int
}

type groupChunk struct {
	rng     cp.Range
	seq     int           // its index in GroupRoom.chunks
	reports map[int][]int // rank -> positions it reported, successful ones only
	// owned[rank] are the positions rank owns, once the rule can say:
	// computed once per chunk, not per report.
	owned [][]int
}

// NewGroupRoom starts a room of group g; totalPages is the request's page
// count when the room was Expected (0 when only its last chunk will say).
func NewGroupRoom(g Group, room uint64, totalPages int) (*GroupRoom, error) {
	if err := CheckGroup(g); err != nil {
		return nil, public(err)
	}
	if totalPages < 0 {
		return nil, public(BadInput("room %d: %d pages", room, totalPages))
	}
	return newGroupRoom(g, room, totalPages), nil
}

// newGroupRoom is NewGroupRoom for a Group already validated.
func newGroupRoom(g Group, room uint64, totalPages int) *GroupRoom {
	return &GroupRoom{g: g, room: room, totalPages: totalPages, byRange: map[[2]int]*groupChunk{},
		unknownBy: make([]int, g.Size), missing: make([]int, g.Size)}
}

// Verdict is the room's state; Err says why it failed.
func (r *GroupRoom) Verdict() Verdict {
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
func (r *GroupRoom) Err() error { return public(r.err) }

func (r *GroupRoom) fail(err error) Verdict {
	if r.err == nil && !r.complete {
		r.err = err
	}
	return r.Verdict()
}

// Report records rank's notice of chunk c (status, positions, last) and
// returns the room's verdict after it. A report after the room ended
// changes nothing.
func (r *GroupRoom) Report(rank int, c Chunk) Verdict {
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
	learnt := false // the request's page count, from this last chunk
	if c.Last {
		total := (rng.End + r.g.PageSize - 1) / r.g.PageSize
		if r.totalPages != 0 && r.totalPages != total {
			return r.fail(where("the last chunk ends at page %d, the room has %d pages", total, r.totalPages))
		}
		learnt = r.totalPages == 0 && total != 0
		r.totalPages = total
	}
	// The owner rule lists a rank's positions in order; a rank may report
	// them in any.
	ch.reports[rank] = slices.Sorted(slices.Values(c.Positions))
	if learnt {
		// Owners the rule could not say before may be known now.
		return r.redecide()
	}
	if err := r.check(ch, rank); err != nil {
		return r.fail(err)
	}
	return r.decide()
}

// adds reports whether a successful report of c would add a chunk: a
// range no rank reported yet. A range that cannot be a chunk adds none
// (Report fails the room).
func (r *GroupRoom) adds(c Chunk) bool {
	rng, err := cp.ChunkRange(c.Start, c.End, r.g.PageSize, c.Last)
	if err != nil {
		return false
	}
	return r.byRange[[2]int{rng.Start, rng.End}] == nil
}

// chunk finds or adds the chunk of rng; a range that overlaps another
// chunk's without being it is an error, as are a second last chunk and a
// chunk past the last.
func (r *GroupRoom) chunk(rng cp.Range) (*groupChunk, error) {
	if ch := r.byRange[[2]int{rng.Start, rng.End}]; ch != nil {
		if ch.rng.Last != rng.Last {
			return nil, errors.Newf("another rank reported this chunk with last = %v", ch.rng.Last)
		}
		return ch, nil
	}
	if ch := r.overlapped(rng); ch != nil {
		return nil, errors.Newf("overlaps chunk [%d, %d) another rank reported", ch.rng.Start, ch.rng.End)
	}
	if rng.Last && r.last != nil {
		return nil, errors.Newf("a second last chunk (the first is [%d, %d))", r.last.rng.Start, r.last.rng.End)
	}
	// A chunk past the last is no part of the request: the room would
	// complete holding it.
	if r.last != nil && rng.End > r.last.rng.End {
		return nil, errors.Newf("past the last chunk [%d, %d)", r.last.rng.Start, r.last.rng.End)
	}
	if rng.Last && r.maxEnd > rng.End {
		return nil, errors.Newf("the last chunk, but chunks reported reach token %d", r.maxEnd)
	}
	ch := &groupChunk{rng: rng, seq: len(r.chunks), reports: map[int][]int{}}
	r.chunks = append(r.chunks, ch)
	r.byRange[[2]int{rng.Start, rng.End}] = ch
	list := &r.spans
	if rng.Start == rng.End {
		list = &r.empties
	}
	i, _ := slices.BinarySearchFunc(*list, rng.Start, func(k, start int) int { return cmp.Compare(r.chunks[k].rng.Start, start) })
	*list = slices.Insert(*list, i, ch.seq)
	r.covered += rng.End - rng.Start
	r.maxEnd = max(r.maxEnd, rng.End)
	if rng.Last {
		r.last = ch
	}
	r.account(ch)
	return ch, nil
}

// overlapped is the chunk, other than rng's own, that rng overlaps (the
// first reported of those found), or nil. Two ranges overlap when each
// starts before the other ends: a chunk of no token overlaps the chunks
// it falls strictly inside of.
func (r *GroupRoom) overlapped(rng cp.Range) *groupChunk {
	var found *groupChunk
	take := func(ch *groupChunk) {
		if rng.Start < ch.rng.End && ch.rng.Start < rng.End && (found == nil || ch.seq < found.seq) {
			found = ch
		}
	}
	// The spans do not overlap, so they end in the order they start: those
	// rng overlaps are the run from the first that ends after rng starts,
	// for as long as they start before rng ends (once, as an overlap fails
	// the room).
	i := sort.Search(len(r.spans), func(i int) bool { return r.chunks[r.spans[i]].rng.End > rng.Start })
	for ; i < len(r.spans) && r.chunks[r.spans[i]].rng.Start < rng.End; i++ {
		take(r.chunks[r.spans[i]])
	}
	// The empty chunks rng overlaps start strictly inside it.
	i = sort.Search(len(r.empties), func(i int) bool { return r.chunks[r.empties[i]].rng.Start > rng.Start })
	for ; i < len(r.empties) && r.chunks[r.empties[i]].rng.Start < rng.End; i++ {
		take(r.chunks[r.empties[i]])
	}
	return found
}

// owned returns the positions of chunk ch that rank owns, once the rule
// can say (the contiguous rule needs the request's page count, which does
// not change once known).
func (r *GroupRoom) owned(ch *groupChunk, rank int) ([]int, bool) {
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

// account counts what a chunk just added, or one whose owners the rule
// may say now, still needs.
func (r *GroupRoom) account(ch *groupChunk) {
	if _, known := r.owned(ch, 0); !known {
		r.unknown++
		for rank := range ch.reports {
			r.unknownBy[rank]++
		}
		return
	}
	for rank, want := range ch.owned {
		if _, reported := ch.reports[rank]; !reported && len(want) > 0 {
			r.missing[rank]++
			r.missingAll++
		}
	}
}

// check holds rank's report of ch, just recorded, to the owner rule when
// it can say, and counts it.
func (r *GroupRoom) check(ch *groupChunk, rank int) error {
	want, known := r.owned(ch, rank)
	if !known {
		r.unknownBy[rank]++
		return nil
	}
	if err := r.wrong(ch, rank, want); err != nil {
		return err
	}
	if len(want) > 0 {
		r.missing[rank]--
		r.missingAll--
	}
	return nil
}

// wrong says why rank's report of ch is not what the rank owns, or nil.
func (r *GroupRoom) wrong(ch *groupChunk, rank int, want []int) error {
	got := ch.reports[rank]
	switch {
	case len(want) == 0:
		return errors.Mark(errors.Newf("room %d chunk [%d, %d): rank %d reported it, but owns none of its pages", r.room, ch.rng.Start, ch.rng.End, rank), ErrChunkFailed)
	case !slices.Equal(got, want):
		return errors.Mark(errors.Newf("room %d chunk [%d, %d): rank %d reported positions %v, it owns %v", r.room, ch.rng.Start, ch.rng.End, rank, got, want), ErrChunkFailed)
	}
	return nil
}

// redecide recounts the room over every chunk, in the order they were
// reported, checking each report the owner rule can now say of: once,
// when the request's page count became known.
func (r *GroupRoom) redecide() Verdict {
	r.unknown, r.missingAll = 0, 0
	clear(r.unknownBy)
	clear(r.missing)
	for _, ch := range r.chunks {
		if _, known := r.owned(ch, 0); known {
			for rank := range r.g.Size {
				if _, reported := ch.reports[rank]; reported {
					if err := r.wrong(ch, rank, ch.owned[rank]); err != nil {
						return r.fail(err)
					}
				}
			}
		}
		r.account(ch)
	}
	return r.decide()
}

// decide completes the room when nothing is missing: the last chunk, a
// chunk in between, a chunk whose owners are unknown, or a report.
func (r *GroupRoom) decide() Verdict {
	if r.unknown > 0 || r.missingAll > 0 || !r.tiled() {
		return Waiting
	}
	r.complete = true
	return Complete
}

// Owes reports whether the room still needs a report from rank: a chunk
// it owns pages of that it has not reported, or a chunk not yet seen.
func (r *GroupRoom) Owes(rank int) bool {
	if r.Verdict() != Waiting {
		return false
	}
	if r.last == nil {
		return true
	}
	if rank < 0 || rank >= r.g.Size || r.missing[rank] > 0 || r.unknown > r.unknownBy[rank] {
		return true
	}
	// A chunk between those seen may still come, and rank may own pages of
	// it.
	return !r.tiled()
}

// tiled reports whether the chunks seen cover the request from token 0 to
// the last chunk's end without a gap: they do not overlap and none lies
// past the last, so they leave none when they cover as many tokens as lie
// before the furthest end.
func (r *GroupRoom) tiled() bool {
	return r.last != nil && r.covered == r.maxEnd
}

// Missing reports whether a chunk already seen has pages of rank that
// rank has not reported: what a rank that said goodbye can no longer send.
func (r *GroupRoom) Missing(rank int) bool {
	return r.Verdict() == Waiting && rank >= 0 && rank < r.g.Size && r.missing[rank] > 0
}

// Lost fails the room when it still needs rank: the rank's session went
// away (cause says how; the error is marked ErrPrefillLost). It returns the
// verdict after. Whether the rank's writes stopped is not the room's to
// say: the core marks its error ErrNotQuiesced unless the rank's access
// was revoked.
func (r *GroupRoom) Lost(rank int, cause error) Verdict {
	if r.Owes(rank) {
		return r.fail(errors.Mark(errors.Wrapf(cause, "room %d: rank %d lost", r.room, rank), ErrPrefillLost))
	}
	return r.Verdict()
}
