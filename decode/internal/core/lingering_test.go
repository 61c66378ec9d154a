package core

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLingeringOf: the lingering rooms of one id that match, in id and
// birth order, found without a sort of the others; none matching costs no
// allocation.
func TestLingeringOf(t *testing.T) {
	l := &ledger{lingering: map[*croom]bool{}}
	var want []*croom
	for i := range 200 {
		r := &croom{id: uint64(i % 10), born: uint64(200 - i), dirty: map[*csession]bool{}}
		if r.id == 3 && i%20 != 3 {
			want = append(want, r)
		}
		if r.id == 3 && i%20 == 3 {
			r.released = true // matches the id, not the predicate
		}
		l.lingering[r] = true
	}
	match := func(r *croom) bool { return !r.released }
	got := l.lingeringOf(3, match)
	require.ElementsMatch(t, want, got)
	require.IsIncreasing(t, func() []uint64 {
		var b []uint64
		for _, r := range got {
			b = append(b, r.born)
		}
		return b
	}(), "born order within one id")
	require.Empty(t, l.lingeringOf(42, match))
	require.Zero(t, testing.AllocsPerRun(100, func() { _ = l.lingeringOf(42, match) }), "no room matches: no allocation")
}
