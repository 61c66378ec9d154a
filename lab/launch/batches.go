package launch

import (
	"fmt"
	"sync"
	"time"
)

// book is the launcher's record of its batches: which ranks and rooms of
// each reported, and when a batch ends. It applies the nodes' events as
// they come (from the supervisor) and closes a batch's done channel once
// every rank and every room reported, or once the nodes that could report
// are gone. Its methods are safe for concurrent use.
type book struct {
	ranks, requests int

	mu      sync.Mutex
	batches map[int]*batch
	faultAt time.Time
}

// batch is one batch in flight or ended.
type batch struct {
	row      BatchRow
	start    time.Time
	ranks    map[int]bool // the ranks that reported (or are gone)
	lastSeen time.Time
	done     chan struct{}
	closed   bool
}

func newBook(ranks, requests int) *book {
	return &book{ranks: ranks, requests: requests, batches: map[int]*batch{}}
}

// start records batch n, run by decode instance dec.
func (k *book) start(n int, dec string) *batch {
	bt := &batch{row: BatchRow{Batch: n, Decode: dec}, start: time.Now(), ranks: map[int]bool{}, done: make(chan struct{})}
	k.mu.Lock()
	k.batches[n] = bt
	k.mu.Unlock()
	return bt
}

// faulted records when the fault struck (once).
func (k *book) faulted(at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.faultAt.IsZero() {
		k.faultAt = at
	}
}

// rankReported applies a rank's "batch" event.
func (k *book) rankReported(e Event) {
	k.mu.Lock()
	defer k.mu.Unlock()
	bt := k.batches[e.Batch]
	if bt == nil || bt.ranks[e.Rank] {
		return
	}
	bt.ranks[e.Rank] = true
	bt.row.RanksReported++
	bt.row.FailedChunks += e.Failed
	bt.row.Bytes += e.Bytes
	if e.FirstFailureUnixMs != 0 && !k.faultAt.IsZero() {
		bt.row.RanksFailedAfterFaultMs = max(bt.row.RanksFailedAfterFaultMs, float64(e.FirstFailureUnixMs-k.faultAt.UnixMilli()))
	}
	if e.OK {
		bt.row.RanksOK++
	} else if bt.row.Error == "" {
		bt.row.Error = fmt.Sprintf("rank %d: %s", e.Rank, e.Error)
	}
	k.settleLocked(bt)
}

// roomEnded applies decode instance dec's "room" event: only the instance
// that runs the batch speaks for its rooms.
func (k *book) roomEnded(dec string, e Event) {
	k.mu.Lock()
	defer k.mu.Unlock()
	bt := k.batches[e.Batch]
	if bt == nil || bt.row.Decode != dec {
		return
	}
	if !k.faultAt.IsZero() && bt.start.Before(k.faultAt) {
		bt.row.RoomsEndedAfterFaultMs = float64(time.Since(k.faultAt).Microseconds()) / 1000
	}
	if e.Complete {
		bt.row.RoomsComplete++
	} else {
		bt.row.RoomsFailed++
		if bt.row.Error == "" {
			bt.row.Error = fmt.Sprintf("%s room %d: %s", dec, e.Room, e.Error)
		}
	}
	k.settleLocked(bt)
}

// openOn lists the batches open on decode instance dec.
func (k *book) openOn(dec string) []int {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []int
	for _, bt := range k.batches {
		if bt.row.Decode == dec && !bt.closed {
			out = append(out, bt.row.Batch)
		}
	}
	return out
}

// decodeExited: the rooms of dec's open batches will never report; each
// such batch ends when its ranks have.
func (k *book) decodeExited(dec string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, bt := range k.batches {
		// A batch whose rooms all completed lost nothing (a drained
		// instance exits once its ranks said goodbye, which may be
		// heard before their batch events).
		if bt.row.Decode != dec || bt.closed || bt.row.RoomsComplete >= k.requests {
			continue
		}
		bt.row.RoomsFailed = k.requests - bt.row.RoomsComplete
		if bt.row.Error == "" {
			bt.row.Error = "decode instance " + dec + " exited"
		}
		bt.lastSeen = time.Now()
		if bt.row.RanksReported == k.ranks {
			k.closeLocked(bt)
		}
	}
}

// rankExited: rank will report no open batch.
func (k *book) rankExited(rank int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, bt := range k.batches {
		if bt.ranks[rank] || bt.closed {
			continue
		}
		bt.ranks[rank] = true
		bt.row.RanksReported++
		if bt.row.Error == "" {
			bt.row.Error = fmt.Sprintf("rank %d exited", rank)
		}
		k.settleLocked(bt)
	}
}

// expire ends bt unreported: its bound ran out.
func (k *book) expire(bt *batch, why string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if bt.closed {
		return
	}
	if bt.row.Error == "" {
		bt.row.Error = why
	}
	k.closeLocked(bt)
}

// settleLocked ends a batch once every rank and every room reported.
func (k *book) settleLocked(bt *batch) {
	bt.lastSeen = time.Now()
	if bt.closed || bt.row.RanksReported < k.ranks || bt.row.RoomsComplete+bt.row.RoomsFailed < k.requests {
		return
	}
	k.closeLocked(bt)
}

func (k *book) closeLocked(bt *batch) {
	if bt.closed {
		return
	}
	bt.closed = true
	bt.row.Seconds = time.Since(bt.start).Seconds()
	if !k.faultAt.IsZero() && bt.start.Before(k.faultAt) {
		bt.row.EndedAfterFaultMs = float64(bt.lastSeen.Sub(k.faultAt).Microseconds()) / 1000
	}
	bt.row.Complete = bt.row.RanksOK == k.ranks && bt.row.RoomsComplete == k.requests
	close(bt.done)
}

// open counts the batches started and not ended.
func (k *book) open() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, bt := range k.batches {
		if !bt.closed {
			n++
		}
	}
	return n
}

// rows returns the rows of batches 0..n-1 that started, in order, and
// whether all n started and completed.
func (k *book) rows(n int) (rows []BatchRow, complete bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	complete = true
	for b := range n {
		bt := k.batches[b]
		if bt == nil {
			complete = false
			continue
		}
		rows = append(rows, bt.row)
		complete = complete && bt.row.Complete
	}
	return rows, complete
}

// outcome reports whether bt ended complete.
func (k *book) outcome(bt *batch) (closed, complete bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return bt.closed, bt.row.Complete
}

// drained says what a drain that began at at lost: the batches in flight
// then (started before, not ended before) and those of them that did not
// complete.
func (k *book) drained(at time.Time) DrainRow {
	k.mu.Lock()
	defer k.mu.Unlock()
	var d DrainRow
	for _, bt := range k.batches {
		if !bt.start.Before(at) {
			continue
		}
		end := bt.start.Add(time.Duration(bt.row.Seconds * float64(time.Second)))
		if bt.closed && end.Before(at) {
			continue
		}
		d.InFlight++
		if !bt.closed || !bt.row.Complete {
			d.Lost++
		}
	}
	d.Seconds = time.Since(at).Seconds()
	return d
}
