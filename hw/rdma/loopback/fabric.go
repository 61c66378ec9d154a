package loopback

import (
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/internal/clock"
)

// Options model the fabric.
type Options struct {
	// Bandwidth is each sending node's link rate in modeled bytes per second;
	// zero means unlimited.
	Bandwidth float64
	// Latency is added to every batch's completion.
	Latency time.Duration
	// TimeScale is modeled seconds per wall second; zero means 1.
	TimeScale float64
	// ByteScale is modeled bytes per real byte, so that a run with shrunken
	// pages keeps realistic link times; zero means 1.
	ByteScale float64
	// Slow, if set, slows single batches down: a slow link for reliability
	// tests, or batches that overtake each other. It runs inside Post, on
	// the poster's goroutine.
	Slow func(BatchInfo) Slowdown
	// OnLand, if set, observes every write as it lands (ahead of its
	// batch's completion on a modeled link), on the goroutine that lands
	// it: the link's, or the one calling Post where Post copies, while the
	// copy is under way: it must not call into the transport nor take a
	// lock that a caller of Post may hold.
	OnLand func(Landing)
	// OnBatch, if set, observes every batch that completed successfully, on
	// the link's goroutine just before its done runs; the same rules as for
	// OnLand apply.
	OnBatch func(BatchSpan)
	// Precise lands batches at their modeled instant to within microseconds
	// (see hw/cuda/sim.Options.Precise).
	Precise bool
	// ReadDevice, if set, lets the transport register memory that is not
	// hostmem as device memory (a GPU pool) and read write sources from it,
	// the way a GPUDirect-capable NIC would: cuMemcpyDtoH into the staging
	// buffer when the batch is posted. Device memory cannot be a
	// destination here.
	ReadDevice func(dst []byte, src uint64) error
}

// BatchInfo identifies a batch for Options.Slow.
type BatchInfo struct {
	From, To string
	Seq      uint64 // per sending node, from 1
	Bytes    uint64
	Writes   int
	Dst      uint64 // the first write's destination address (0 if none)
}

// Slowdown is how much longer one batch takes, in modeled time.
type Slowdown struct {
	// Hold occupies the link this much longer: later batches wait too.
	Hold time.Duration
	// Extra lands the batch this much later without holding the link, so
	// that later batches may land before it.
	Extra time.Duration
}

// Landing is one write that reached its destination.
type Landing struct {
	Node   string // destination node
	Addr   uint64
	Len    uint64
	Posted time.Time // when its batch was posted
	At     time.Time // when it landed
}

// BatchSpan is one batch's life on the link, in wall time.
type BatchSpan struct {
	From, To string
	Seq      uint64
	Bytes    uint64 // real bytes; the link modeled Bytes x ByteScale
	Posted   time.Time
	// Due is the modeled landing instant; Landed is when the batch
	// completed, later than Due by the link goroutine's wake-up, or by
	// the copy where the copy could not finish in time.
	Due, Landed time.Time
	// Copy is the emulator's own cost: the real memcpy into the
	// destination, done ahead of Due where the link's time allows.
	Copy time.Duration
}

// MaxModeled is the longest time the link can model for a batch, in
// modeled or in wall time: time.Duration's range, about 292 years.
const MaxModeled = clock.MaxDuration

// LinkTime is how long a link under these options is busy with n real
// bytes (one batch of them, or every byte of a run back to back): its
// modeled time (n × ByteScale bytes over Bandwidth) and its wall time (the
// modeled one over TimeScale), and whether both fit within MaxModeled. The
// link computes every batch's time this way; one that does not fit is
// held at MaxModeled rather than wrapped into a negative or small time
// (a batch done before it was posted), so a caller that sizes runs must
// refuse such a rate up front, as kvstream sim and generate do. An
// unlimited link (Bandwidth 0) takes no time.
func (o Options) LinkTime(n uint64) (modeled, wall time.Duration, ok bool) {
	if o.Bandwidth <= 0 {
		return 0, 0, true
	}
	byteScale, timeScale := o.ByteScale, o.TimeScale
	if byteScale <= 0 {
		byteScale = 1
	}
	if timeScale <= 0 {
		timeScale = 1
	}
	ns := float64(n) * byteScale / o.Bandwidth * float64(time.Second)
	modeled, okM := clock.Duration(ns)
	wall, okW := clock.Duration(ns / timeScale)
	return modeled, wall, okM && okW
}

// Fabric connects the transports of one process.
type Fabric struct {
	opts   Options
	mu     sync.Mutex
	nodes  map[string]*Transport
	access map[string]*access // peer access points (Transport.OpenPeerAccess)
}

// NewFabric returns an empty fabric.
func NewFabric(opts Options) *Fabric {
	if opts.TimeScale <= 0 {
		opts.TimeScale = 1
	}
	if opts.ByteScale <= 0 {
		opts.ByteScale = 1
	}
	return &Fabric{opts: opts, nodes: map[string]*Transport{}, access: map[string]*access{}}
}

// NewTransport adds a node; its Address is its name.
func (f *Fabric) NewTransport(name string) (*Transport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == "" {
		return nil, errors.New("loopback: node name must not be empty")
	}
	if _, dup := f.nodes[name]; dup {
		return nil, errors.Newf("loopback: node %q already exists", name)
	}
	if _, dup := f.access[name]; dup {
		return nil, errors.Newf("loopback: %q is a peer access point's address", name)
	}
	t := newTransport(f, name)
	f.nodes[name] = t
	go t.out.run()
	return t, nil
}

// resolve returns the node an address reaches, and the access point it
// goes through when it is not the node's own name.
func (f *Fabric) resolve(name string) (*Transport, *access) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.nodes[name]; t != nil {
		return t, nil
	}
	if a := f.access[name]; a != nil {
		return a.t, a
	}
	return nil, nil
}

// addAccess names an access point, unless the name is taken.
func (f *Fabric) addAccess(a *access) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nodes[a.name] != nil || f.access[a.name] != nil {
		return false
	}
	f.access[a.name] = a
	return true
}

// forget removes a node's or an access point's name.
func (f *Fabric) forget(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.nodes, name)
	delete(f.access, name)
}

var (
	defaultOnce   sync.Once
	defaultFabric *Fabric
)

// Default returns the process's shared fabric with no modeled link: the
// embedded default through which an engine and an in-process decode pool
// reach each other.
func Default() *Fabric {
	defaultOnce.Do(func() { defaultFabric = NewFabric(Options{}) })
	return defaultFabric
}
