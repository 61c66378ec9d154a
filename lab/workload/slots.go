package workload

import (
	"context"
	"sync"
)

// residency keeps the sim's memory to the requests in flight: the pools
// hold plan.resident requests' pages (slots), request r takes the slot of
// request r-resident, and only once that one's last chunk finished, its
// pages checked and handed back (release). The forward loop waits for it
// when it has not, as a serving scheduler whose KV pool is full holds a
// request back.
type residency struct {
	resident int
	complete []chan struct{} // per request: closed when its last chunk's Finish returned

	mu      sync.Mutex
	left    map[int]int // a sharded run's last chunk: ranks still to finish it
	ranks   int
	waits   int // times the forward loop found the slot it needed busy
	release func(room int)
}

// newResidency admits requests of p into its slots; a request's last chunk
// is finished once ranks engines finished it; release(room) checks and
// hands back a finished request's pages before another takes them.
func newResidency(p *plan, requests, ranks int, release func(room int)) *residency {
	rs := &residency{resident: p.resident, complete: make([]chan struct{}, requests), left: map[int]int{}, ranks: ranks, release: release}
	for r := range rs.complete {
		rs.complete[r] = make(chan struct{})
	}
	return rs
}

// finished records that one engine's Finish of room's last chunk returned,
// whatever its status: when Finish returns, no write of the chunk can
// still land (the engine's quiesce-before-reuse invariant; where it could
// not make sure, ErrNotQuiesced, the chunk failed and so does the run).
func (rs *residency) finished(room int) {
	rs.mu.Lock()
	n, ok := rs.left[room]
	if !ok {
		n = rs.ranks
	}
	n--
	if n > 0 {
		rs.left[room] = n
	} else {
		delete(rs.left, room)
	}
	rs.mu.Unlock()
	if n == 0 {
		close(rs.complete[room])
	}
}

// admit is called before room's first chunk is registered: it waits until
// the request that held room's slot finished, then releases that one's
// pages.
func (rs *residency) admit(ctx context.Context, room int) error {
	prev := room - rs.resident
	if prev < 0 {
		return nil
	}
	select {
	case <-rs.complete[prev]:
	default:
		rs.mu.Lock()
		rs.waits++
		rs.mu.Unlock()
		select {
		case <-rs.complete[prev]:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	rs.release(prev)
	return nil
}

// stillResident reports the rooms still holding their slot at the end of a run
// in which every earlier room was released.
func (rs *residency) stillResident() (from, to int) {
	return max(0, len(rs.complete)-rs.resident), len(rs.complete)
}

// slotWaits is how often the forward loop waited for a slot.
func (rs *residency) slotWaits() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.waits
}

// notifier tells a decode side in another process how each chunk ended,
// in order per slot, off the transfer workers: a worker calls its next
// Finish at once instead of after the other process checked the previous
// chunk (which would hold the next chunk's Finish, and so its exposed
// time, behind a check of a whole chunk's pages). A request's slot is
// released only after its last notice was answered (after), so that the
// decode side checks its pages before another request writes them.
type notifier struct {
	chs []chan notified
	wg  sync.WaitGroup
}

type notified struct {
	n     Notice
	after func() // or nil
}

// newNotifier starts a goroutine per slot that hands notices to send.
func newNotifier(slots, depth int, send func(Notice)) *notifier {
	nt := &notifier{chs: make([]chan notified, slots)}
	for s := range nt.chs {
		// A slot's request is not replaced before its last notice was
		// answered: one request's chunks are all a slot ever queues.
		nt.chs[s] = make(chan notified, depth)
		nt.wg.Add(1)
		go func() {
			defer nt.wg.Done()
			for x := range nt.chs[s] {
				send(x.n)
				if x.after != nil {
					x.after()
				}
			}
		}()
	}
	return nt
}

// notify queues n for room's slot; after, if set, runs once it was sent.
func (nt *notifier) notify(room int, n Notice, after func()) {
	nt.chs[room%len(nt.chs)] <- notified{n, after}
}

// close sends what is queued and stops.
func (nt *notifier) close() {
	for _, ch := range nt.chs {
		close(ch)
	}
	nt.wg.Wait()
}
