package core

import (
	"slices"

	"github.com/cockroachdb/errors"
)

// ledger is the decode pool's pages and who may write them: the pool's
// geometry, the room holding each page, the released rooms whose pages
// are not yet quiet, and the pages kept out for good. Its rule: no page
// goes to a new room while a peer may still write it.
//
// Between any two messages (checked by the fuzz test): every page held is
// held by one room that lists it, live or lingering, and within the pool;
// no page held is kept out.
type ledger struct {
	pool     []Buffer // nil until sized
	pages    int      // the smallest buffer's capacity
	pageSize int      // tokens per page: the Rules', or the first session's; 0 until known

	owner map[int]*croom // page -> the room holding it
	// lingering are released rooms whose pages are not yet quiet: a peer
	// may still write them.
	lingering  map[*croom]bool
	quarantine map[int]bool // pages kept out for good
	// tainted: a session's access could not be confirmed revoked. It holds
	// the pool's keys, so the pool is never released again.
	tainted bool
}

func newLedger(pageSize int) ledger {
	return ledger{pageSize: pageSize, owner: map[int]*croom{}, lingering: map[*croom]bool{}, quarantine: map[int]bool{}}
}

// sized reports whether the ledger has a pool.
func (l *ledger) sized() bool { return l.pool != nil }

func (l *ledger) setPool(bufs []Buffer) {
	l.pool = slices.Clone(bufs)
	l.pages = 0
	for i, b := range bufs {
		if i == 0 || b.Pages < l.pages {
			l.pages = b.Pages
		}
	}
}

// free says why page p cannot go to a new room, or nil.
func (l *ledger) free(p int) error {
	if l.quarantine[p] {
		return errors.Mark(errors.Newf("decode page %d may still be written by a prefill whose access could not be revoked: it is kept out for good", p), ErrNotQuiesced)
	}
	if o := l.owner[p]; o != nil {
		if o.released {
			return errors.Mark(errors.Newf("decode page %d is held by released room %d until its prefill's writes stopped", p, o.id), ErrNotQuiesced)
		}
		return errors.Newf("decode page %d belongs to room %d", p, o.id)
	}
	return nil
}

// hold gives pages to room r.
func (l *ledger) hold(r *croom, pages ...int) {
	for _, p := range pages {
		l.owner[p] = r
		r.held = append(r.held, p)
	}
}

// linger keeps a released room's pages out of new rooms until it settles.
func (l *ledger) linger(r *croom) { l.lingering[r] = true }

// settle takes back the pages of a room that is over and quiet; those of
// a poisoned one (a writer's revocation not confirmed) are kept out for
// good. It returns how many pages it kept out.
func (l *ledger) settle(r *croom) (keptOut int) {
	if r.poisoned {
		for _, p := range r.held {
			l.quarantine[p] = true
		}
		keptOut = len(r.held)
	}
	for _, p := range r.held {
		if l.owner[p] == r {
			delete(l.owner, p)
		}
	}
	r.held = nil
	delete(l.lingering, r)
	return keptOut
}

// releasable reports whether nothing in the ledger keeps the pool: no
// page a peer may still write.
func (l *ledger) releasable() bool {
	return l.pool != nil && !l.tainted && len(l.lingering) == 0 && len(l.quarantine) == 0
}

// release forgets the pool and every page held; the page size goes back to
// pageSize (the Rules').
func (l *ledger) release(pageSize int) {
	clear(l.owner)
	l.pool, l.pages = nil, 0
	l.pageSize = pageSize
}
