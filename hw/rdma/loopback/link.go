package loopback

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/internal/clock"
	"github.com/kvstream/kvstream/hw/rdma"
)

// link is a sending node's side of the fabric: it stamps each batch with
// its modeled landing instant and lands the batches in that order on its
// own goroutine.
type link struct {
	opts *Options
	// unmodeled: no bandwidth, latency or slowdown, so every batch lands
	// at once and its copy's cost is of no use; stamps: hooks that want
	// the times even so (OnLand, OnBatch).
	unmodeled, stamps bool

	// The direct path (unmodeled, no hooks, host sources): Post copies the
	// bytes and queues only the completion here, under mu; the link
	// goroutine takes every queued completion in one go and runs them.
	// idle says that it waits for a signal: Post signals only then, so
	// that a stream of batches costs no channel operation per batch.
	completions []completion
	spareComp   []completion
	idle        atomic.Bool

	mu        sync.Mutex
	queue     []*batch // by landing instant, stable for equal instants
	busyUntil time.Time
	seq       atomic.Uint64

	// copyCost is the measured wall time of copying one byte (float64
	// bits, ns), a moving average over this node's copies: a batch's copy
	// starts that long, with a margin, before its landing instant.
	copyCost atomic.Uint64
	// staged counts the batches posted for the link goroutine to copy and
	// not copied yet: while there is one, Post does not copy a batch
	// itself, which would land it before an earlier post to the same place.
	staged atomic.Int64

	wake    chan struct{}
	closing atomic.Bool
	stopped chan struct{}
}

// The copy's lead over the landing instant: twice the expected copy time,
// plus copyMargin for a timer that fires late (about a millisecond on a VM).
const (
	initialCopyCost = 1.0 // ns per byte, until a copy was measured
	copyMargin      = 2 * time.Millisecond
)

func (l *link) init(opts *Options) {
	l.opts, l.wake, l.stopped = opts, make(chan struct{}, 1), make(chan struct{})
	l.unmodeled = opts.Bandwidth == 0 && opts.Latency == 0 && opts.Slow == nil
	l.stamps = opts.OnLand != nil || opts.OnBatch != nil
	l.copyCost.Store(math.Float64bits(initialCopyCost))
}

// lead is how long before its landing instant a batch of n real bytes must
// start its copy to be in place by then.
func (l *link) lead(n uint64) time.Duration {
	return time.Duration(2*math.Float64frombits(l.copyCost.Load())*float64(n)) + copyMargin
}

// measured feeds a copy's duration into the cost estimate. Copies under
// 64 KiB say more about the clock than about the memory.
func (l *link) measured(n uint64, d time.Duration) {
	if n < 64<<10 {
		return
	}
	old := math.Float64frombits(l.copyCost.Load())
	l.copyCost.Store(math.Float64bits(0.75*old + 0.25*float64(d)/float64(n)))
}

// completion is a direct batch whose bytes landed in Post: what is left
// is to run done, on the link goroutine.
type completion struct {
	ep   *Endpoint
	done func(error)
	err  error
}

// complete queues a direct batch's completion. The caller holds e.landMu,
// so that an Endpoint.Close that waited for it finds the completion here
// (or the link goroutine took it: then it is reported as landed).
func (l *link) complete(c completion) {
	l.mu.Lock()
	l.completions = append(l.completions, c)
	l.mu.Unlock()
}

// wakeIfIdle signals the link goroutine if it waits for a signal.
func (l *link) wakeIfIdle() {
	if l.idle.Load() {
		l.signal()
	}
}

// cancel takes the endpoint's queued completions off the link, for Close
// to fail them.
func (l *link) cancel(e *Endpoint) []completion {
	l.mu.Lock()
	defer l.mu.Unlock()
	var mine []completion
	kept := l.completions[:0]
	for _, c := range l.completions {
		if c.ep == e {
			mine = append(mine, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(l.completions[len(kept):])
	l.completions = kept
	return mine
}

// batch is one posted batch on its way through the link.
type batch struct {
	ep       *Endpoint
	info     BatchInfo
	writes   []rdma.Write
	srcs     [][]byte // per write: source bytes
	dsts     [][]byte // per write: destination bytes
	staged   []byte   // on a modeled link: the sources as read at post time
	done     func(error)
	posted   time.Time
	landAt   time.Time     // the modeled landing instant: done runs then
	copyAt   time.Time     // on a modeled link: when the staged bytes' copy must start
	copyDur  time.Duration // how long the copy into the destination took
	applied  bool          // landed or failed already; only the report is left
	err      error         // the outcome once applied
	reported bool          // done was called (guarded by ep.mu)
}

// Batch records are reused once land has reported them, so that the steady
// state of a transfer allocates nothing per batch. A record that Close failed
// is left to the collector: Close calls its done after letting go of ep.mu,
// and the link may still pop it from the queue.
var batches = sync.Pool{New: func() any { return new(batch) }}

func newBatch(n int) *batch {
	b := batches.Get().(*batch)
	if cap(b.srcs) < n {
		b.srcs, b.dsts = make([][]byte, n), make([][]byte, n)
	}
	b.srcs, b.dsts = b.srcs[:n], b.dsts[:n]
	return b
}

func recycle(b *batch) {
	putStage(b.staged)
	clear(b.srcs) // drop references to registered memory
	clear(b.dsts)
	*b = batch{srcs: b.srcs[:0], dsts: b.dsts[:0], writes: b.writes[:0]}
	batches.Put(b)
}

// schedule stamps b with its post and landing instants and reports whether
// it lands at once (nothing modeled delays it).
func (l *link) schedule(b *batch, slow Slowdown) (now bool) {
	opts := l.opts
	busy, _, _ := opts.LinkTime(b.info.Bytes)
	if slow.Hold > 0 {
		busy = min(busy, MaxModeled-slow.Hold) + slow.Hold // held at MaxModeled, as LinkTime holds it
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Stamped under the link's lock, so that stamps and busyUntil move
	// together: a stamp taken before another poster's batch moved busyUntil
	// would send this batch the modeled way on an unmodeled link, and a
	// later batch of the same poster could land before it.
	b.posted = time.Now()
	start := b.posted
	if l.busyUntil.After(start) {
		start = l.busyUntil
	}
	l.busyUntil = start.Add(scaled(busy, opts.TimeScale))
	b.landAt = l.busyUntil.Add(scaled(opts.Latency+slow.Extra, opts.TimeScale))
	return !b.landAt.After(b.posted)
}

// enqueue hands b to the link goroutine.
func (l *link) enqueue(b *batch) {
	l.mu.Lock()
	i := len(l.queue)
	for i > 0 && l.queue[i-1].landAt.After(b.landAt) {
		i--
	}
	l.queue = append(l.queue, nil)
	copy(l.queue[i+1:], l.queue[i:])
	l.queue[i] = b
	l.mu.Unlock()
	l.signal()
}

func (l *link) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// stop ends the link goroutine; the node's endpoints are closed already, so
// every batch left in the queue was failed.
func (l *link) stop() {
	l.closing.Store(true)
	l.signal()
	<-l.stopped
}

// run copies staged batches into their destinations ahead of their landing
// instants, in landing order, and reports each batch at its instant: the
// emulator's copy is not charged to modeled time unless it is longer than
// the batch's whole time on the link (BatchSpan says by how much).
func (l *link) run() {
	defer close(l.stopped)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []*batch // reused: only this goroutine touches it
	for {
		if l.closing.Load() {
			return
		}
		// Take every due batch off the head in one go. The head is read
		// and removed under one lock: a concurrent Post may insert a batch
		// with an earlier landing instant in front of it.
		l.mu.Lock()
		if len(l.completions) > 0 {
			comps := l.completions
			l.completions = l.spareComp[:0]
			l.mu.Unlock()
			for i, c := range comps {
				c.done(c.err)
				comps[i] = completion{}
			}
			l.mu.Lock()
			l.spareComp = comps[:0]
			l.mu.Unlock()
			continue
		}
		now := time.Now()
		for len(l.queue) > 0 && !l.queue[0].landAt.After(now) {
			due = append(due, l.queue[0])
			l.queue[0] = nil // the record may be reused once landed
			l.queue = l.queue[1:]
		}
		var next, copyAt time.Time
		var copyNext *batch
		if len(due) == 0 && len(l.queue) > 0 {
			next = l.queue[0].landAt
			// The first batch not yet copied is copied as soon as it or
			// any batch behind it must start: copies go in landing order,
			// so that a later write to the same place wins.
			for _, b := range l.queue {
				if b.applied {
					continue
				}
				if copyNext == nil || b.copyAt.Before(copyAt) {
					copyAt = b.copyAt
				}
				if copyNext == nil {
					copyNext = b
				}
			}
		}
		l.mu.Unlock()
		if len(due) > 0 {
			for i, b := range due {
				b.ep.land(b)
				due[i] = nil
			}
			due = due[:0]
			continue
		}
		if copyNext != nil && !copyAt.After(now) {
			copyNext.ep.apply(copyNext)
			continue
		}
		if next.IsZero() {
			// Idle: from now on Post signals. Checked again after saying
			// so, or a completion queued in between would wait for the
			// next signal.
			l.idle.Store(true)
			l.mu.Lock()
			pending := len(l.completions) > 0 || len(l.queue) > 0
			l.mu.Unlock()
			if !pending && !l.closing.Load() {
				<-l.wake
			}
			l.idle.Store(false)
			continue
		}
		precise := l.opts.Precise
		if copyNext != nil && copyAt.Before(next) {
			next, precise = copyAt, false // the copy's lead absorbs a late timer
		}
		d := next.Sub(now)
		if precise && d <= clock.Slack {
			clock.SleepUntil(next, true)
			continue
		}
		if precise {
			d -= clock.Slack // wake early, then land on time
		}
		timer.Reset(d)
		select {
		case <-timer.C:
		case <-l.wake:
			timer.Stop() // Go 1.23+: no stale value survives Stop
		}
	}
}

// apply copies a staged batch's bytes into the destination, unless the
// endpoint was torn down or the peer is gone. Only the link goroutine calls
// it, for batches on its queue.
func (e *Endpoint) apply(b *batch) {
	e.landMu.Lock()
	defer e.landMu.Unlock()
	e.to.inbound.RLock()
	defer e.to.inbound.RUnlock()
	e.mu.Lock()
	if !b.reported {
		b.err = e.fate(b)
	}
	skip := b.reported || b.err != nil
	e.mu.Unlock()
	if !skip {
		e.copyBytes(b)
	}
	b.applied = true
	e.from.out.staged.Add(-1)
}

// land reports a batch at its landing instant (copying its bytes first if
// that has not happened yet), unless the endpoint was torn down first.
func (e *Endpoint) land(b *batch) {
	if !b.applied {
		e.apply(b)
	}
	e.mu.Lock()
	if b.reported { // Close failed it
		e.mu.Unlock()
		return
	}
	b.reported = true
	delete(e.pending, b)
	e.mu.Unlock()
	if f := e.from.fab.opts.OnBatch; f != nil && b.err == nil {
		f(BatchSpan{From: b.info.From, To: b.info.To, Seq: b.info.Seq, Bytes: b.info.Bytes, Posted: b.posted, Due: b.landAt, Landed: time.Now(), Copy: b.copyDur})
	}
	b.done(b.err)
	recycle(b)
}

// fate decides whether a batch's bytes may land: nil, or why it fails. The
// caller holds the peer's inbound lock.
func (e *Endpoint) fate(b *batch) error {
	if e.to.isClosed() {
		return errors.Mark(errors.Newf("loopback: batch %d %s->%s: the peer is gone", b.info.Seq, b.info.From, b.info.To), rdma.ErrEndpointBroken)
	}
	return nil
}

// copyBytes lands a batch's bytes and times the copy. The caller holds
// e.landMu.
func (e *Endpoint) copyBytes(b *batch) {
	opts := e.from.fab.opts
	if l := &e.from.out; l.unmodeled && !l.stamps && b.staged == nil {
		for i, dst := range b.dsts {
			copy(dst, b.srcs[i])
		}
		return
	}
	start := time.Now()
	off := 0
	for i, dst := range b.dsts {
		if b.staged != nil {
			copy(dst, b.staged[off:off+len(dst)])
			off += len(dst)
		} else {
			copy(dst, b.srcs[i])
		}
		if opts.OnLand != nil {
			opts.OnLand(Landing{Node: e.to.name, Addr: b.writes[i].Dst, Len: b.writes[i].Len, Posted: b.posted, At: time.Now()})
		}
	}
	b.copyDur = time.Since(start)
	e.from.out.measured(b.info.Bytes, b.copyDur)
}
