package sim

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/internal/standin"
	"github.com/kvstream/kvstream/hw/internal/clock"
)

// Options configure a virtual GPU.
type Options struct {
	// TimeScale is modeled seconds per wall-clock second: 10 runs a 1 s
	// kernel in 100 ms. Zero means 1.
	TimeScale float64
	// OnSpan, if set, observes every kernel after it ran (wall-clock times).
	OnSpan func(Span)
	// Faults, if set, decides per recorded event whether it misbehaves.
	Faults func(EventInfo) Fault
	// Precise ends kernels at their modeled instant to within microseconds
	// (by yielding the last stretch instead of trusting the timer), at the
	// cost of some busy CPU. Benchmarks want it; tests need not.
	Precise bool
}

// Span is one executed kernel: [Start, End) on the modeled timeline (as
// wall-clock instants), and Ran, the wall-clock instant its Run returned
// (events recorded after it complete right after Ran).
type Span struct {
	Stream     string
	Name       string
	Start, End time.Time
	Ran        time.Time
}

// EventInfo identifies a recorded event for fault decisions.
type EventInfo struct {
	Stream string
	Seq    uint64 // 1 for the stream's first event
}

// Fault is how a recorded event misbehaves.
type Fault int

const (
	// NoFault: the event completes when the stream passes it.
	NoFault Fault = iota
	// NeverComplete: the event never completes (a hung kernel).
	NeverComplete
	// WaitError: waiting on the event fails with a device error.
	WaitError
	// RecordError: recording the event fails.
	RecordError
)

// ErrInjected marks failures produced by fault injection.
var ErrInjected = errors.New("sim: injected fault")

// GPU is a virtual device owning streams.
type GPU struct {
	opts    Options
	mu      sync.Mutex
	streams []*Stream
}

// New returns a virtual GPU.
func New(opts Options) *GPU {
	if opts.TimeScale <= 0 {
		opts.TimeScale = 1
	}
	return &GPU{opts: opts}
}

// TimeScale returns modeled seconds per wall second.
func (g *GPU) TimeScale() float64 { return g.opts.TimeScale }

// MaxModeled is the longest wall time a kernel can take: time.Duration's
// range, about 292 years.
const MaxModeled = clock.MaxDuration

// WallTime is the wall time a kernel of modeled duration d takes under
// these options (d over TimeScale), and whether it fits within MaxModeled.
// A stream computes every kernel's end this way; one that does not fit
// is held at MaxModeled rather than wrapped into a negative time (a kernel
// done before it began), so a caller that sizes runs must refuse such a
// duration or time scale up front, as kvstream sim does.
func (o Options) WallTime(d time.Duration) (time.Duration, bool) {
	scale := o.TimeScale
	if scale <= 0 {
		scale = 1
	}
	return clock.Duration(float64(d) / scale)
}

// NewStream starts a stream. Close the GPU (or the stream) to stop it.
func (g *GPU) NewStream(name string) *Stream {
	s := &Stream{gpu: g, name: name, q: standin.NewQueue[op](), quit: make(chan struct{}), stopped: make(chan struct{})}
	g.mu.Lock()
	g.streams = append(g.streams, s)
	g.mu.Unlock()
	go s.loop()
	return s
}

// Close stops every stream; events not reached yet fail.
func (g *GPU) Close() {
	g.mu.Lock()
	streams := g.streams
	g.streams = nil
	g.mu.Unlock()
	for _, s := range streams {
		s.Close()
	}
}

// Kernel is device work taking Duration of modeled time.
type Kernel struct {
	Name     string
	Duration time.Duration
	// Start, if set, runs when the kernel starts: work whose effects a
	// correct reader must never see (poisoning the output). Keep it to a
	// few microseconds: a kernel's start is often another one's end, when
	// what waited for that end must get the CPU.
	Start func()
	// Prepare, if set, runs inside the modeled interval, late (as late as
	// its recent cost allows before Run) and never in the interval's first
	// PrepareDelay: the expensive computation of the results, kept off the
	// instants around a kernel's start, where transfers gated by the
	// previous kernel are posted and land.
	Prepare func()
	// Run, if set, runs at the end of the modeled interval: its effects are
	// the kernel's results, visible before any event recorded after the
	// kernel completes. The stream starts it early by what recent Runs
	// cost, so that it ends at the modeled end; keep it to a copy.
	Run func()
}

// PrepareDelay is how long after a kernel's start Prepare may run at the
// earliest (less in a kernel shorter than twice that): the previous
// forward's last batches land within a fraction of a millisecond of its
// end, which is the next forward's first kernel's start.
const PrepareDelay = time.Millisecond

type op struct {
	kernel   Kernel
	event    *Event
	launched time.Time
}

// Stream executes kernels in launch order on its own goroutine.
type Stream struct {
	gpu  *GPU
	name string
	// q is stopped by Close, once.
	q *standin.Queue[op]

	quit    chan struct{} // closed by Close: modeled sleeps end early
	stopped chan struct{}
}

var _ cuda.Stream = (*Stream)(nil)

// Name returns the stream's name.
func (s *Stream) Name() string { return s.name }

// Launch enqueues a kernel; it returns at once.
func (s *Stream) Launch(k Kernel) error {
	return s.q.Push(op{kernel: k, launched: time.Now()})
}

// Record enqueues an event; it completes when every kernel launched before it
// has run.
func (s *Stream) Record() (cuda.Event, error) {
	seq := s.q.NextSeq()
	ev := &Event{}
	ev.Init("sim", s.name, seq)
	if f := s.gpu.opts.Faults; f != nil {
		ev.fault = f(EventInfo{Stream: s.name, Seq: seq})
		if ev.fault == RecordError {
			return nil, errors.Mark(errors.Newf("sim: record event %d on stream %s", seq, s.name), ErrInjected)
		}
	}
	if err := s.q.Push(op{event: ev, launched: time.Now()}); err != nil {
		return nil, err
	}
	return ev, nil
}

// Synchronize waits until everything launched so far has run.
func (s *Stream) Synchronize(ctx context.Context) error {
	ev, err := s.Record()
	if err != nil {
		return err
	}
	return ev.Wait(ctx)
}

// Close stops the stream. Work not yet run is dropped and its events fail.
func (s *Stream) Close() {
	if s.q.Stop(errors.Mark(errors.Newf("sim: stream %s is closed", s.name), cuda.ErrDeviceLost)) {
		close(s.quit) // a modeled sleep under way ends now
	}
	<-s.stopped
}

func (s *Stream) loop() {
	defer close(s.stopped)
	scale := s.gpu.opts.TimeScale
	var busyUntil time.Time // modeled end of the last kernel, as a wall-clock instant
	var lead leads
	var batch []op
	for {
		var closed error
		batch, closed = s.q.Take(batch)
		if closed != nil {
			for _, o := range append(batch, s.q.Drain()...) {
				if o.event != nil {
					o.event.Fail(errors.Mark(errors.Newf("sim: stream %s closed before event %d", s.name, o.event.Seq()), cuda.ErrDeviceLost))
				}
			}
			return
		}
		if len(batch) == 0 {
			s.q.Wait()
			continue
		}
		for i, o := range batch {
			if !s.run(o, &busyUntil, &lead, scale) {
				// Closed mid-kernel: what was not run yet fails with the
				// rest of the queue.
				s.q.PushFront(batch[i+1:])
				break
			}
		}
	}
}

// leads are how early a kernel's Prepare and Run start before its modeled
// end: their recent costs, with a margin.
type leads struct {
	prepare, run time.Duration
}

// runAt runs f at instant at and updates *lead, how long f takes lately
// (a quarter more than its last run, decaying slowly), by which the next
// one starts ahead. It returns false if the stream was closed while it
// waited.
func (s *Stream) runAt(at time.Time, f func(), lead *time.Duration) bool {
	if !clock.SleepUntilOr(at, s.gpu.opts.Precise, s.quit) {
		return false
	}
	t := time.Now()
	f()
	*lead = max(time.Since(t)*5/4, *lead*7/8)
	return true
}

// run performs one op at its modeled time. It returns false if the stream
// was closed while it waited.
func (s *Stream) run(o op, busyUntil *time.Time, lead *leads, scale float64) bool {
	if o.event != nil {
		// The device passed the event when the kernel before it
		// ended, or when it was recorded on an idle stream.
		at := *busyUntil
		if o.launched.After(at) {
			at = o.launched
		}
		if o.event.reach(at) {
			// Someone may be waiting for it (a submitter, a forward loop):
			// let it run now rather than when this goroutine next sleeps,
			// which on two busy cores can be tens of microseconds later
			// and is charged to the transfer it gates.
			runtime.Gosched()
		}
		return true
	}
	// A kernel starts when the previous one ended, or at its launch
	// if the stream was idle then.
	start := *busyUntil
	if o.launched.After(start) {
		start = o.launched
	}
	wall, _ := clock.Duration(float64(o.kernel.Duration) / scale) // held at its longest (see WallTime)
	end := start.Add(wall)
	// Start's work happens inside the modeled interval; the results
	// (Run) at its end, then the events after it: at the modeled
	// instant, or later by what Start overran. Run begins early by
	// what the recent Runs cost, so that its copy is done by the
	// modeled end rather than after it: the emulator's cost stays
	// out of modeled time. A read in that last sliver of the
	// interval would go unseen; reads a group early cannot.
	if !clock.SleepUntilOr(start, s.gpu.opts.Precise, s.quit) {
		return false
	}
	if o.kernel.Start != nil {
		o.kernel.Start()
	}
	if o.kernel.Prepare != nil {
		// As late as the recent Prepares and Runs allow, but not in the
		// interval's first PrepareDelay (half of a short kernel).
		prepAt := end.Add(-lead.run - lead.prepare)
		if earliest := start.Add(min(PrepareDelay, end.Sub(start)/2)); prepAt.Before(earliest) {
			prepAt = earliest
		}
		if !s.runAt(prepAt, o.kernel.Prepare, &lead.prepare) {
			return false
		}
	}
	if o.kernel.Run != nil {
		runAt := end.Add(-lead.run)
		if runAt.Before(start) {
			runAt = start
		}
		if !s.runAt(runAt, o.kernel.Run, &lead.run) {
			return false
		}
	}
	if !clock.SleepUntilOr(end, s.gpu.opts.Precise, s.quit) {
		return false
	}
	*busyUntil = end
	if f := s.gpu.opts.OnSpan; f != nil {
		f(Span{Stream: s.name, Name: o.kernel.Name, Start: start, End: end, Ran: time.Now()})
	}
	return true
}

// Event is a simulated CUDA event. Its device timestamp (CompletedAt,
// cuda.Timed) is the modeled instant the stream passed it (a wall-clock
// instant; the end of the kernel before it).
type Event struct {
	standin.Event
	fault Fault
}

var (
	_ cuda.Event = (*Event)(nil)
	_ cuda.Timed = (*Event)(nil)
)

// reach completes the event at the device instant at; it reports whether
// the event completed (a faulty one may not).
func (e *Event) reach(at time.Time) bool {
	switch e.fault {
	case NeverComplete:
		return false
	case WaitError:
		e.Fail(errors.Mark(errors.Newf("sim: event %d on stream %s: injected wait error", e.Seq(), e.Stream()), ErrInjected))
		return true
	}
	e.Reach(at)
	return true
}
