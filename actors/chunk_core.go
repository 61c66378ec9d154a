package actors

import (
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
)

// ErrTimeout marks a chunk that did not complete within its finish or drop
// timeout.
var ErrTimeout = errors.New("timeout")

// ErrCancelled marks a chunk failed because its Finish caller gave up.
var ErrCancelled = errors.New("cancelled")

// ResendLimit is how many times a chunk re-sends one Work (a group, or the
// rest, to one destination) whose batch broke or whose completion was
// overdue: a transient fault (a reset connection, a queue pair in error, a
// lost completion) costs a resend, a destination that breaks every batch
// fails the chunk instead of looping until its timeout.
const ResendLimit = 3

// ResendBackoff is how long the second re-send of a Work waits after the
// quiescence, and a quarter of what the third waits; the first goes at
// once. A connection that broke once is usually a transient fault, and a
// fresh one works at once; one that breaks again right away often meets
// the same fault still clearing (UCX over TCP refuses fresh connections for
// a moment after a reset), and waiting keeps the resend limit for faults
// that last.
const ResendBackoff = 25 * time.Millisecond

// resendWait is how long re-send n (from 1) waits.
func resendWait(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	return ResendBackoff << (2 * (n - 2))
}

// ErrResendLimit marks a chunk failed because one of its Works broke, or
// was overdue, more than ResendLimit times.
var ErrResendLimit = errors.New("resend limit reached")

// CompletionDeadline is how long a finishing chunk waits for the
// completion of a batch in flight, from Finish or from its post, whichever
// came later, before it treats the batch as lost (BatchOverdue): a quarter
// of what the finish timeout leaves before its teardown reserve (7.25 s of
// the default 30 s). A healthy batch completes in a small fraction of the
// timeout even on a loaded machine; a chunk whose batch took that long
// would be at risk of its timeout anyway, and a false alarm costs a
// re-send, not the chunk. A quarter leaves room for the loss to be
// detected, the endpoint closed and the Work re-sent within the timeout.
func CompletionDeadline(timeout time.Duration) time.Duration {
	return (timeout - TeardownReserve(timeout)) / 4
}

// MinHealthyRate is the least rate, in bytes per second, at which a slow
// but healthy transport drains what is in flight (1 GiB/s: TCP on a 10 Gb/s
// link; RDMA moves 10 to 50 times that). A batch past its completion
// deadline while the engine has more in flight than this rate drains
// within the deadline may be queued behind that traffic: its watch is
// re-armed for the drain time instead of writing it off.
const MinHealthyRate = 1 << 30

// drainTime is how long MinHealthyRate takes to drain bytes, at most a
// day (the input is a message's: bounded, never overflowing).
func drainTime(bytes uint64) time.Duration {
	return time.Duration(min(float64(bytes)/MinHealthyRate, 86400) * float64(time.Second))
}

// TeardownReserve is how much of a finish timeout a chunk keeps for tearing
// down what is still in flight at its deadline: it gives up at timeout
// minus this, so that the teardown (immediate on loopback, a bounded drain
// on UCX) also fits in the timeout.
func TeardownReserve(timeout time.Duration) time.Duration { return min(timeout/10, time.Second) }

// ChunkCore is the functional core of one chunk context. It decides which
// groups to accept (invariants 4 and 11), what is still owed at the end of
// the forward or at finish (invariant 3), when the chunk is complete
// (everything enqueued was processed and every posted batch completed), how
// it resumes a Work whose batch broke or whose completion is overdue once
// it is finishing (Resend, WatchBatch: the endpoint quiesced, the Work
// re-sent, at most ResendLimit times), and how it fails (closed, and
// quiesced before it answers: invariants 9, 10).
type ChunkCore struct {
	id       messages.Chunk
	perLayer bool
	empty    bool
	dests    int
	routes   []*plan.Route // per destination: its route, nil for every buffer
	layout   *plan.Layout

	bound   bool
	forward uint64
	ended   bool

	accepted []bool // per group: enqueued from our forward
	restSent bool

	enqueued, processed int // Work sent / answered by a submitter
	posted, completed   int // batches posted / completed
	// work holds, per (seq, destination) of the Work sent, whether it was
	// sent, answered (Submitted), posted and completed (BatchDone, or
	// written off when overdue): a Submitted or BatchDone that answers
	// nothing sent, or answers it twice, is ignored
	// (Stats.Strays) rather than counted as progress, so that no stray
	// completion can make the chunk complete before its batches landed.
	work []uint8
	// resent counts, per Work slot, its re-sends after a broken batch;
	// quiescing the Resend effects not yet answered by Quiesced: the chunk
	// answers only once none is pending, so that nothing of a broken
	// endpoint lands after it answered.
	resent    []uint8
	quiescing int
	restBufs  []int // the rest's buffers, for a re-send
	// lost, per Work slot: bit t is set when the batch of its post t was
	// written off at its completion deadline (counted as completed, its
	// Work re-sent); its completion, if it ever comes (a transport's
	// Close fails the batches it held), counts for nothing.
	lost []uint8
	// deadline is CompletionDeadline of the Finish's timeout: batches in
	// flight are watched from Finish on (0 before: no one waits yet).
	deadline time.Duration
	torn     bool // TornDown came while a quiescence was pending
	// unfenced, per destination: a broken endpoint's writes to it may
	// still land until a batch posted after its Close lands there
	// (rdma.ErrFenced); a chunk that answers anything but SUCCESS with one
	// set says not quiesced.
	unfenced []bool

	err       error
	finishing bool
	dropping  bool
	tearing   bool // waiting for TornDown before answering
	reply     chan<- messages.Result
	done      bool
	stats     messages.Stats
	out       []Effect
}

// NewChunkCore returns the core of a chunk context for plan.
func NewChunkCore(l *plan.Layout, p *plan.Plan) *ChunkCore {
	c := &ChunkCore{
		id:       p.Chunk,
		perLayer: p.Mode == cp.PerLayer,
		empty:    p.Empty(),
		dests:    len(p.Dests),
		layout:   l,
		accepted: make([]bool, l.Groups.Count()),
	}
	for i, d := range p.Dests {
		if d.Route != nil {
			if c.routes == nil {
				c.routes = make([]*plan.Route, len(p.Dests))
			}
			c.routes[i] = d.Route
		}
	}
	return c
}

// sends reports whether destination d receives any of bufs: a resharded
// peer whose stage holds none of their layers gets no Work (and no empty
// batch) for them.
func (c *ChunkCore) sends(d int, bufs []int) bool {
	return c.routes == nil || c.routes[d] == nil || c.routes[d].Sends(bufs)
}

// ID returns the chunk's identity.
func (c *ChunkCore) ID() messages.Chunk { return c.id }

// Done reports whether the chunk answered and ended.
func (c *ChunkCore) Done() bool { return c.done }

// Counts returns (enqueued, processed, posted, completed): the finish target
// and progress, for tests and traces.
func (c *ChunkCore) Counts() (enqueued, processed, posted, completed int) {
	return c.enqueued, c.processed, c.posted, c.completed
}

// Step feeds one message and returns the effects to perform, in order. The
// returned slice is reused by the next call.
func (c *ChunkCore) Step(msg any) []Effect {
	c.out = c.out[:0]
	if c.done {
		// A chunk that answered still checks what reaches it late: a
		// submitter's or a transport's report of its work is accepted
		// once, a stray one is said.
		switch m := msg.(type) {
		case *messages.Submitted:
			c.mark(m.Seq, m.Dest, workAnswered, "Submitted")
		case *messages.BatchDone:
			if !c.late(m) {
				c.mark(m.Seq, m.Dest, workDone, "BatchDone")
			}
		}
		return c.out
	}
	switch m := msg.(type) {
	case *messages.Bind:
		c.bind(m)
	case *messages.GroupReady:
		c.groupReady(m)
	case *messages.ForwardEnd:
		c.forwardEnd(m)
	case *messages.Finish:
		c.finish(m)
	case *messages.Drop:
		c.drop(m)
	case *messages.Submitted:
		c.submitted(m)
	case *messages.BatchDone:
		c.batchDone(m)
	case *messages.Cancel:
		c.fail(errors.Mark(errors.Wrap(m.Reason, "finish abandoned by its caller"), ErrCancelled))
	case *messages.Timeout:
		c.timeout()
	case *messages.TornDown:
		c.tornDown(m)
	case *messages.Quiesced:
		c.quiesced(m)
	case *messages.BatchOverdue:
		c.overdue(m)
	}
	c.settle()
	return c.out
}

func (c *ChunkCore) bind(m *messages.Bind) {
	// A context binds to the first forward that begins after it was
	// registered and to no other (invariant 4). A finishing context that
	// never saw a forward already sent everything.
	if c.bound || c.finishing || c.dropping {
		return
	}
	c.bound, c.forward = true, m.Forward
	c.stats.Forward = m.Forward
}

func (c *ChunkCore) groupReady(m *messages.GroupReady) {
	if !c.bound || m.Forward != c.forward || c.ended || m.Group < 0 || m.Group >= len(c.accepted) || c.accepted[m.Group] {
		// Another forward re-firing our layers, a duplicate, or a late
		// group: accepting it would grow the finish target without end.
		c.stats.Ignored++
		return
	}
	c.accepted[m.Group] = true
	if !c.perLayer || c.empty || c.err != nil || c.dropping {
		return // the group is accounted for; the monolithic send covers it
	}
	if m.Err != nil {
		c.fail(errors.Wrapf(m.Err, "room %d chunk %d: record event for group %d", c.id.Room, c.id.Start, m.Group))
		return
	}
	bufs := c.layout.GroupBuffers(m.Group)
	if len(bufs) == 0 {
		return
	}
	c.stats.Groups++
	// One Work, hence one batch, per destination: a destination's failure
	// is its own Work's and batch's, and the finish target counts them all.
	for d := 0; d < c.dests; d++ {
		if c.sends(d, bufs) {
			c.submit(messages.Work{Seq: m.Group, Dest: d, Buffers: bufs, Event: m.Event})
		}
	}
}

func (c *ChunkCore) forwardEnd(m *messages.ForwardEnd) {
	if !c.bound || m.Forward != c.forward || c.ended {
		return
	}
	c.ended = true
	c.stats.ForwardEnd = m.At.Round(0)
	c.sendRest(m.Event, m.Err, "end-of-forward")
}

// sendRest sends everything no accepted group covered, gated by ev: the
// hookless buffers and groups that never fired, or all buffers to every
// destination for a monolithic chunk. evErr (the event could not be
// recorded) fails the chunk only if something was left to send.
func (c *ChunkCore) sendRest(ev messages.Event, evErr error, which string) {
	if c.restSent || c.empty || c.err != nil || c.dropping {
		return
	}
	c.restSent = true
	var bufs []int
	if c.perLayer {
		for g, ok := range c.accepted {
			if !ok {
				bufs = append(bufs, c.layout.GroupBuffers(g)...)
			}
		}
		bufs = append(bufs, c.layout.Hookless()...)
	} else {
		bufs = c.layout.All()
	}
	if len(bufs) == 0 {
		return
	}
	if evErr != nil {
		c.fail(errors.Wrapf(evErr, "room %d chunk %d: record %s event", c.id.Room, c.id.Start, which))
		return
	}
	c.restBufs = bufs
	for d := 0; d < c.dests; d++ {
		if c.sends(d, bufs) {
			c.submit(messages.Work{Seq: messages.Rest, Dest: d, Buffers: bufs, Event: ev})
		}
	}
}

// States of a Work in ChunkCore.work.
const (
	workSent uint8 = 1 << iota
	workAnswered
	workDone
	// workBroken: its batch completed with a resumable error before its
	// Submitted came; the resume waits for the Submitted.
	workBroken
	// workFence: a re-send posted after its destination's broken endpoint
	// was closed unfenced (rdma.ErrFenced): its landing ends that.
	workFence
	// workPosted: its Submitted said posted: a batch is in flight until
	// its BatchDone, or its completion deadline writes it off.
	workPosted
	// workRearmed: its watch fired once while the engine had more in
	// flight than drains within the deadline, and was re-armed for that
	// drain time: the next firing writes the batch off.
	workRearmed
)

// workIndex is the slot of (seq, dest) in c.work, or -1 outside it.
func (c *ChunkCore) workIndex(seq, dest int) int {
	if seq < messages.Rest || seq >= len(c.accepted) || dest < 0 || dest >= c.dests {
		return -1
	}
	return (seq-messages.Rest)*c.dests + dest
}

// mark marks the Work (seq, dest) with flag, and reports whether it was
// sent and not marked so before.
func (c *ChunkCore) mark(seq, dest int, flag uint8, what string) bool {
	i := c.workIndex(seq, dest)
	if i < 0 || c.work == nil || c.work[i]&workSent == 0 || c.work[i]&flag != 0 {
		c.stats.Strays++
		c.out = append(c.out, Stray{Seq: seq, Dest: dest, What: what})
		return false
	}
	c.work[i] |= flag
	return true
}

// try is how many times the Work in slot i was re-sent: the Try of its
// current post.
func (c *ChunkCore) try(i int) int {
	if c.resent == nil {
		return 0
	}
	return int(c.resent[i])
}

func (c *ChunkCore) submit(w messages.Work) {
	w.Chunk = c.id
	if c.work == nil {
		c.work = make([]uint8, (len(c.accepted)-messages.Rest)*c.dests)
	}
	i := c.workIndex(w.Seq, w.Dest)
	c.work[i] |= workSent
	w.Try = c.try(i)
	c.enqueued++
	c.out = append(c.out, Submit{Work: w})
}

func (c *ChunkCore) finish(m *messages.Finish) {
	if c.finishing || c.dropping {
		return
	}
	c.finishing, c.reply = true, m.Reply
	// The caller giving up ends the wait too (ErrCancelled): the shell
	// watches its context with the timer.
	c.out = append(c.out, StartTimer{After: m.Timeout - TeardownReserve(m.Timeout), Caller: m.Ctx})
	if m.Abandoned != nil {
		c.fail(errors.Mark(errors.Wrap(m.Abandoned, "finish abandoned by its caller"), ErrCancelled))
		return
	}
	if !c.bound {
		// No forward ever bound this chunk: the caller finishing it vouches
		// that its KV is written, and m.Event (recorded at Finish on the
		// compute stream) covers everything enqueued so far.
		c.sendRest(m.Event, m.EventErr, "finish")
	}
	// From now on someone waits: every batch in flight, and every one
	// posted later, must complete within the deadline or be resumed.
	c.deadline = CompletionDeadline(m.Timeout)
	for i, st := range c.work {
		if st&workPosted != 0 {
			c.watch(i)
		}
	}
	// Bound but not ended: completion waits for the forward's end (bounded
	// by the timer), because layers not yet enqueued cannot be gated.
}

func (c *ChunkCore) drop(m *messages.Drop) {
	if c.dropping {
		// A later Drop (another decode peer's cancel, the serving stack's
		// own) is bounded by its own timeout too: the chunk answers every
		// Drop within whichever timer fires first.
		c.out = append(c.out, StartTimer{After: m.Timeout - TeardownReserve(m.Timeout)})
		return
	}
	c.dropping = true
	// Pending work is skipped; what is in flight lands or is torn down
	// before the chunk answers, within this timer or the Finish's, whichever
	// fires first. A Finish under way answers DROPPED, never SUCCESS.
	c.out = append(c.out, CancelWork{}, StartTimer{After: m.Timeout - TeardownReserve(m.Timeout)})
}

func (c *ChunkCore) submitted(m *messages.Submitted) {
	if !c.mark(m.Seq, m.Dest, workAnswered, "Submitted") {
		return
	}
	if i := c.workIndex(m.Seq, m.Dest); !m.Posted && c.work[i]&workDone != 0 {
		// A completion came for this Work, whose batch was never posted:
		// it answered nothing, and counted for nothing.
		c.completed--
		c.stats.Strays++
		c.out = append(c.out, Stray{Seq: m.Seq, Dest: m.Dest, What: "BatchDone"})
	}
	c.processed++
	if m.Err != nil {
		c.fail(errors.Wrapf(m.Err, "room %d chunk %d %s", c.id.Room, c.id.Start, part(m.Seq, m.Dest)))
		return
	}
	if !m.Posted {
		return
	}
	c.posted++
	i := c.workIndex(m.Seq, m.Dest)
	c.work[i] |= workPosted
	if c.work[i]&workBroken != 0 {
		defer c.resume(m.Seq, m.Dest, nil)
	}
	c.watch(i)
	c.stats.Bytes += m.Bytes
	c.stats.Blocks += m.Blocks
	c.stats.Batches++
	// Wall-clock readings only (Round(0) drops the monotonic one): a
	// replayed trace carries wall times, and must decide exactly the same.
	c.stats.EventWait += m.WaitEnd.Round(0).Sub(m.WaitStart.Round(0))
	if c.stats.FirstPost.IsZero() || m.PostedAt.Round(0).Before(c.stats.FirstPost) {
		c.stats.FirstPost = m.PostedAt.Round(0)
	}
	if m.PostedAt.Round(0).After(c.stats.LastPost) {
		c.stats.LastPost = m.PostedAt.Round(0)
	}
	if m.WaitEnd.Round(0).After(c.stats.LastWait) {
		c.stats.LastWait = m.WaitEnd.Round(0)
	}
	// After the forward ended, the rest waits on the end-of-forward event:
	// the first of those waits to return is the best host-side reading of
	// when the forward ended on the device.
	if m.Seq == messages.Rest && c.ended && (c.stats.ForwardDone.IsZero() || m.WaitEnd.Round(0).Before(c.stats.ForwardDone)) {
		c.stats.ForwardDone = m.WaitEnd.Round(0)
	}
}

func (c *ChunkCore) batchDone(m *messages.BatchDone) {
	if c.late(m) || !c.mark(m.Seq, m.Dest, workDone, "BatchDone") {
		return
	}
	c.completed++
	if m.At.Round(0).After(c.stats.LastDone) {
		c.stats.LastDone = m.At.Round(0)
	}
	if m.Err == nil {
		if i := c.workIndex(m.Seq, m.Dest); c.work[i]&workFence != 0 {
			c.unfenced[m.Dest] = false
		}
		return
	}
	c.fence(m.Dest, m.Err)
	if m.Broken && c.err == nil && !c.dropping && !c.tearing {
		if i := c.workIndex(m.Seq, m.Dest); c.work[i]&workAnswered == 0 {
			c.work[i] |= workBroken // resumed when its Submitted comes
			return
		}
		c.resume(m.Seq, m.Dest, m.Err)
		return
	}
	c.fail(errors.Wrapf(m.Err, "room %d chunk %d %s: batch failed", c.id.Room, c.id.Start, part(m.Seq, m.Dest)))
}

// watch asks the shell to report the batch in flight in slot i overdue
// (WatchBatch) if its completion has not come by the deadline, once the
// chunk is finishing, and while it can still resume.
func (c *ChunkCore) watch(i int) {
	if c.deadline <= 0 || c.err != nil || c.dropping || c.tearing || c.work[i]&(workDone|workBroken) != 0 {
		return
	}
	k := c.dests
	c.out = append(c.out, WatchBatch{Seq: i/k + messages.Rest, Dest: i % k, Try: c.try(i), After: c.deadline})
}

// overdue treats a batch whose completion did not come within the deadline
// as lost: it writes the batch off (counted completed, so that a
// completion that never comes holds nothing up) and resumes its Work as
// for a broken batch: Resend quiesces the endpoint it went on (after that
// Close nothing of it can land, and the transport fails the batch, or
// never reports it), and the Work is re-sent. Past ResendLimit the chunk
// fails closed and tears down what is in flight before it answers. A
// watch of an earlier post, of a batch that completed or broke, or of a
// chunk that failed, timed out or was dropped (whose teardown covers the
// batch) decides nothing; one that fires while the engine has more in
// flight than MinHealthyRate drains within the deadline is re-armed, once
// per post.
func (c *ChunkCore) overdue(m *messages.BatchOverdue) {
	i := c.workIndex(m.Seq, m.Dest)
	if i < 0 || c.work == nil || m.Try != c.try(i) || c.work[i]&workPosted == 0 || c.work[i]&(workDone|workBroken) != 0 {
		return
	}
	if c.err != nil || c.dropping || c.tearing {
		return
	}
	if wait := drainTime(m.InFlight); wait > c.deadline && c.work[i]&workRearmed == 0 {
		// Slow, not lost: a healthy link may still be draining what was
		// posted ahead of it. Look again once that could have drained,
		// once: by then everything in flight at this firing drained, and
		// what is in flight then (other traffic, or this batch's own bytes,
		// which count until it is written off) says nothing of this batch.
		c.work[i] |= workRearmed
		c.out = append(c.out, WatchBatch{Seq: m.Seq, Dest: m.Dest, Try: m.Try, After: wait})
		return
	}
	c.stats.Overdue++
	if c.try(i) >= ResendLimit {
		c.fail(errors.Mark(errors.Mark(errors.Newf("room %d chunk %d %s: no completion within %v, after %d re-sends (resend limit %d)",
			c.id.Room, c.id.Start, part(m.Seq, m.Dest), c.deadline, c.try(i), ResendLimit), rdma.ErrEndpointBroken), ErrResendLimit))
		// The batch may still be in flight: answer once it cannot land.
		c.tearing = true
		c.out = append(c.out, Teardown{})
		return
	}
	if c.lost == nil {
		c.lost = make([]uint8, len(c.work))
	}
	c.lost[i] |= 1 << c.try(i)
	c.work[i] |= workDone
	c.completed++
	c.resume(m.Seq, m.Dest, errors.Newf("no completion within %v", c.deadline))
}

// late reports whether m is the completion of a batch written off at its
// deadline, arriving after all, and takes it: it counts for nothing (the
// write-off counted it), except that writes it says may still land keep
// the chunk from answering as if its pages were quiet.
func (c *ChunkCore) late(m *messages.BatchDone) bool {
	i := c.workIndex(m.Seq, m.Dest)
	if i < 0 || c.lost == nil || m.Try < 0 || m.Try > ResendLimit || c.lost[i]&(1<<m.Try) == 0 {
		return false
	}
	c.lost[i] &^= 1 << m.Try
	switch {
	case m.Err == nil || !errors.Is(m.Err, rdma.ErrNotQuiesced) || c.done:
	case fenced(m.Err):
		c.fence(m.Dest, m.Err)
	case c.err == nil:
		c.fail(errors.Wrapf(m.Err, "room %d chunk %d %s: overdue batch", c.id.Room, c.id.Start, part(m.Seq, m.Dest)))
	default:
		c.err = errors.WithSecondaryError(errors.Mark(c.err, rdma.ErrNotQuiesced), m.Err)
	}
	return true
}

// BrokenEndpoint says whether a batch that failed with err may be re-sent
// on a fresh endpoint (BatchDone.Broken): its endpoint broke, its peer is
// not lost and did not refuse the writes on purpose (rdma.ErrRevoked), and
// no teardown left writes that may still land, unless a later landing
// fences them (rdma.ErrFenced). The chunk re-sends such a batch unless it
// failed, timed out or was dropped; every other failure fails it closed.
func BrokenEndpoint(err error) bool {
	return errors.Is(err, rdma.ErrEndpointBroken) && !errors.Is(err, ErrPeerLost) && !errors.Is(err, rdma.ErrRevoked) &&
		(!errors.Is(err, rdma.ErrNotQuiesced) || errors.Is(err, rdma.ErrFenced))
}

// fenced says whether err leaves writes that a later landing at the same
// peer fences (rdma.ErrFenced), rather than writes that may land whatever
// happens.
func fenced(err error) bool {
	return errors.Is(err, rdma.ErrNotQuiesced) && errors.Is(err, rdma.ErrFenced)
}

// fence records that writes to dest may still land until a batch posted
// from now on lands there, when err says so.
func (c *ChunkCore) fence(dest int, err error) {
	if !fenced(err) || dest < 0 || dest >= c.dests {
		return
	}
	if c.unfenced == nil {
		c.unfenced = make([]bool, c.dests)
	}
	c.unfenced[dest] = true
}

// resume asks the shell to quiesce the endpoint the Work (seq, dest)'s
// broken batch went on; Quiesced answers, and the Work is re-sent then. A
// Work that broke ResendLimit times already fails the chunk.
func (c *ChunkCore) resume(seq, dest int, cause error) {
	if c.err != nil || c.dropping || c.tearing {
		return
	}
	i := c.workIndex(seq, dest)
	if c.resent == nil {
		c.resent = make([]uint8, len(c.work))
	}
	if int(c.resent[i]) >= ResendLimit {
		c.fail(errors.Mark(errors.Mark(errors.Newf("room %d chunk %d %s: its batch broke %d times (resend limit %d)",
			c.id.Room, c.id.Start, part(seq, dest), c.resent[i]+1, ResendLimit), rdma.ErrEndpointBroken), ErrResendLimit))
		return
	}
	c.resent[i]++
	c.quiescing++
	c.out = append(c.out, Resend{Seq: seq, Dest: dest, After: resendWait(int(c.resent[i])), Cause: cause})
}

// quiesced re-sends the Work whose broken endpoint is now quiet, unless
// the quiescence failed (the chunk fails closed) or the chunk no longer
// sends (it failed, timed out or was dropped meanwhile).
func (c *ChunkCore) quiesced(m *messages.Quiesced) {
	i := c.workIndex(m.Seq, m.Dest)
	if c.quiescing == 0 || i < 0 || c.resent == nil || c.resent[i] == 0 {
		c.stats.Strays++
		c.out = append(c.out, Stray{Seq: m.Seq, Dest: m.Dest, What: "Quiesced"})
		return
	}
	c.quiescing--
	switch {
	case m.Err == nil:
	case fenced(m.Err):
		// The broken endpoint's writes stop landing once the re-send
		// lands; until then the destination is not quiet.
		c.fence(m.Dest, m.Err)
	case c.err == nil:
		c.fail(errors.Wrapf(m.Err, "room %d chunk %d %s: resume", c.id.Room, c.id.Start, part(m.Seq, m.Dest)))
	case errors.Is(m.Err, rdma.ErrNotQuiesced):
		// The chunk failed (a timeout, another destination) while the
		// quiescence ran: the answer must still say not quiesced.
		c.err = errors.WithSecondaryError(errors.Mark(c.err, rdma.ErrNotQuiesced), m.Err)
	}
	if c.tearing {
		if c.torn && c.quiescing == 0 {
			c.answer()
		}
		return
	}
	if c.err != nil || c.dropping {
		return
	}
	bufs := c.restBufs
	if m.Seq != messages.Rest {
		bufs = c.layout.GroupBuffers(m.Seq)
	}
	c.work[i] = 0
	if c.unfenced != nil && c.unfenced[m.Dest] {
		c.work[i] = workFence
	}
	c.stats.Resent++
	c.submit(messages.Work{Seq: m.Seq, Dest: m.Dest, Buffers: bufs, Event: messages.Passed})
}

func (c *ChunkCore) fail(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	c.out = append(c.out, CancelWork{})
}

func (c *ChunkCore) timeout() {
	if (!c.finishing && !c.dropping) || c.tearing {
		return
	}
	e, p, po, co := c.Counts()
	c.fail(errors.Mark(errors.Newf("room %d chunk %d: not complete within the timeout (work %d/%d processed, batches %d/%d completed, forward ended %v)",
		c.id.Room, c.id.Start, p, e, co, po, c.ended), ErrTimeout))
	// Whatever is still in flight must not land after we answer: answer
	// when the teardown reports back.
	c.tearing = true
	c.out = append(c.out, Teardown{})
}

func (c *ChunkCore) tornDown(m *messages.TornDown) {
	if !c.tearing {
		return
	}
	if m.Err != nil {
		c.err = errors.WithSecondaryError(errors.Mark(c.err, rdma.ErrNotQuiesced), m.Err)
	}
	if c.quiescing > 0 {
		// A broken endpoint is still being quiesced: its writes may land
		// until that Close returns.
		c.torn = true
		return
	}
	c.answer()
}

// settle answers once the chunk is complete: everything enqueued was
// processed, every posted batch completed, and (unless it failed or was
// dropped: its gate is closed, nothing more goes out) its forward ended or
// it never had one.
func (c *ChunkCore) settle() {
	if c.done || c.tearing || !(c.finishing || c.dropping) {
		return
	}
	if c.finishing && !c.dropping && c.err == nil && !c.empty && c.bound && !c.ended {
		return
	}
	if c.processed < c.enqueued || c.completed < c.posted || c.quiescing > 0 {
		return
	}
	c.answer()
}

func (c *ChunkCore) answer() {
	res := messages.Result{Chunk: c.id, PerLayer: c.perLayer, Status: messages.Succeeded, Stats: c.stats}
	switch {
	case c.dropping && c.finishing && c.err == nil:
		res.Status = messages.Dropped
		res.Err = errors.Mark(errors.Newf("room %d chunk %d: dropped while its Finish waited", c.id.Room, c.id.Start), ErrDropped)
	case c.dropping && c.finishing:
		// Failed (a timeout, a batch) before the Drop came: the Finish
		// hears DROPPED, so its error says ErrDropped too, beside why it
		// failed.
		res.Status, res.Err = messages.Dropped, errors.Mark(c.err, ErrDropped)
	case c.dropping:
		res.Status, res.Err = messages.Dropped, c.err
	case c.err != nil:
		res.Status, res.Err = messages.Failed, c.err
	}
	if res.Status != messages.Succeeded && !errors.Is(res.Err, rdma.ErrNotQuiesced) {
		for d, u := range c.unfenced {
			if u {
				unquiet := errors.Newf("room %d chunk %d: a broken endpoint's writes to destination %d may still land: no re-send landed there after it closed",
					c.id.Room, c.id.Start, d)
				if res.Err == nil {
					res.Err = errors.Mark(unquiet, rdma.ErrNotQuiesced)
				} else {
					res.Err = errors.WithSecondaryError(errors.Mark(res.Err, rdma.ErrNotQuiesced), unquiet)
				}
				break
			}
		}
	}
	c.done = true
	// Ended before the reply: when Finish returns, the room no longer counts
	// the chunk.
	c.out = append(c.out, ChunkEnded{Result: res, Forget: !c.ended})
	if c.reply != nil {
		c.out = append(c.out, AnswerFinish{To: c.reply, Result: res})
	}
}

func part(seq, dest int) string {
	if seq == messages.Rest {
		return "rest to destination " + strconv.Itoa(dest)
	}
	return "group " + strconv.Itoa(seq) + " to destination " + strconv.Itoa(dest)
}
