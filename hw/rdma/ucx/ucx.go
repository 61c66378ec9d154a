//go:build ucx

package ucx

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// Options tune a Transport. The zero value is the normal configuration.
type Options struct {
	// Name names the UCP context in UCX's logs.
	Name string
	// Config sets UCX configuration variables for this Transport, named
	// without the UCX_ prefix ("TLS": "tcp"). They override the
	// environment. UCX accepts names it does not know and only warns.
	Config map[string]string
	// NoWakeup leaves out UCP_FEATURE_WAKEUP, for transports that have no
	// event support: the idle progress loop then naps 50µs at a time
	// instead of sleeping on the worker's event fd.
	NoWakeup bool
	// Spin is how long the progress loop keeps polling an idle worker
	// before it sleeps: polling keeps latency low while traffic flows,
	// sleeping frees the core when it does not. Zero means 50µs; negative
	// means sleep at once.
	Spin time.Duration
	// CloseDrain bounds how long Endpoint.Close and Close wait for the
	// writes already handed to UCX to complete before forcing the endpoint
	// closed (see Endpoint.Close). Zero means 5s. Negative means force at
	// once, which is a barrier only where the sender performs the writes
	// (RDMA NICs), not over TCP or shared memory.
	CloseDrain time.Duration
	// CloseTimeout bounds how long Endpoint.Close and Close wait for UCX
	// to release an endpoint after the drain (invariant 9: never
	// hang). Zero means 10s.
	CloseTimeout time.Duration
	// Writes is how peers write the memory this Transport registers or
	// allocates (doc.go, "Writes"): WriteMessages (the default) or
	// WriteRMA. A Transport of either mode writes to a peer of the
	// message mode; only a WriteRMA Transport writes to one of the RMA
	// mode.
	Writes WriteMode
	// RevokeLinger is how long the worker of an access point revoked in
	// the message mode keeps answering its peer (every FLUSH with a
	// refusal, so that its batches fail rather than hang) before it is
	// destroyed, with its connections. The revocation itself is
	// immediate. Zero means 2s; negative means destroy at once.
	RevokeLinger time.Duration
	// Fragment is the most bytes one message write carries: a longer
	// write is cut into messages of this size. Zero means
	// DefaultFragment. It should fit in one eager message of the
	// transports in use (UCX then delivers it without reassembling it),
	// and must not exceed MaxFragment.
	Fragment uint64
	// AccessHost is the IP address (or a name resolved once, by New) that
	// access points (OpenPeerAccess) listen on for their peer's
	// connections, through UCX's sockaddr connection manager (doc.go,
	// "Connection setup"): an address peers reach, and the one UCX's tcp
	// transport binds on its interface (the interface's first IPv4
	// address), since UCX connects a client-server connection's tcp lanes
	// to the IP the connection came in to. Empty means 127.0.0.1.
	AccessHost string
	// AccessConnect is how peers connect to access points (doc.go,
	// "Connection setup"): AccessAuto (the default), AccessListener or
	// AccessWorkerAddress.
	AccessConnect AccessConnect
}

// AccessConnect says how peers connect to a Transport's access points
// (doc.go, "Connection setup").
type AccessConnect int

const (
	// AccessAuto: through a listener where UCX is older than 1.14, peers
	// write with messages (WriteMessages) and UCX_TLS names a network
	// transport; else by worker address.
	AccessAuto AccessConnect = iota
	// AccessListener: through a listener wherever UCX_TLS names a network
	// transport, whatever the version and write mode.
	AccessListener
	// AccessWorkerAddress: by the access point's worker address.
	AccessWorkerAddress
)

// listens reports whether access points take their peers' connections
// through a listener (else they give out their worker address), for a
// write mode, UCX_TLS value and UCX version (major, minor).
func (c AccessConnect) listens(w WriteMode, tls string, version [2]int) bool {
	if c == AccessWorkerAddress || !connectsBySockaddr(tls) {
		return false
	}
	if c == AccessListener {
		return true
	}
	// Only 1.13 and older purge a wireup reply under the assertion the
	// listener avoids (openucx/ucx 9ccaf31, in 1.14), and a listener has
	// faults of its own; in WriteRMA a key unpacked early trips UCX 1.18.
	return w == WriteMessages && (version[0] < 1 || version[0] == 1 && version[1] < 14)
}

// WriteMode says how peers write a Transport's memory.
type WriteMode int

const (
	// WriteMessages: a write is a UCX active message that the receiving
	// Transport applies after checking it against the regions it
	// registered, on its progress goroutine. A peer writes nothing else,
	// and nothing at all once its access point is revoked (a barrier, on
	// every UCX transport); a peer that dies mid-transfer costs the
	// receiver nothing. The context has no UCP_FEATURE_RMA.
	WriteMessages WriteMode = iota
	// WriteRMA: a write is a UCX put (ucp_put_nbx) into memory registered
	// with ucp_mem_map, the zero-copy path of RDMA NICs and GPUs
	// (GPUDirect, cuda_ipc). Where UCX has no RMA for the memory (TCP,
	// shared memory FIFOs) it emulates puts with messages that apply
	// whatever address the peer names, and it aborts the receiving
	// process when the peer dies with puts in flight: use it only with
	// UCX_TLS restricted to RDMA NICs, GPU transports and self, between
	// trusted peers.
	WriteRMA
)

// String names the mode as the commands' flags do.
func (m WriteMode) String() string {
	switch m {
	case WriteMessages:
		return "messages"
	case WriteRMA:
		return "rma"
	}
	return fmt.Sprintf("WriteMode(%d)", int(m))
}

// ParseWriteMode reads "messages" or "rma".
func ParseWriteMode(s string) (WriteMode, error) {
	switch s {
	case "messages":
		return WriteMessages, nil
	case "rma":
		return WriteRMA, nil
	}
	return 0, errors.Newf("ucx: write mode %q: want messages or rma", s)
}

// Fragment bounds.
const (
	// DefaultFragment fits one eager message of UCX's tcp transport
	// (UCX_TCP_RX_SEG_SIZE, 64 KiB, less its headers).
	DefaultFragment = 60 << 10
	// MaxFragment bounds Options.Fragment.
	MaxFragment = 16 << 20
)

// defaults are applied unless the environment or Options.Config set the
// variable; doc.go says why. UCX warns about a variable that no transport in
// use reads, hence the conditions.
func (o Options) defaults() [][2]string {
	// One lane for eager messages: a FLUSH is answered only after every
	// write sent before it on its endpoint, which UCX delivers in order on
	// one lane (the default in 1.13; pinned here).
	d := [][2]string{{"RCACHE_ENABLE", "n"}, {"MAX_EAGER_LANES", "1"}}
	if usesSharedMemory(o.tls()) {
		d = append(d, [2]string{"MM_ERROR_HANDLING", "y"})
	}
	return d
}

// envDefaults are set in the process's environment, where neither it nor
// Options.Config sets them, before the context reads its configuration: a
// transport's own variable (a prefixed one, as TCP_MAX_POLL or
// IB_REG_METHODS) given to ucp_config_modify reaches no interface in UCX
// 1.13, which warns "invalid configuration" instead; the environment
// reaches it in every version. doc.go says why each.
func (o Options) envDefaults() [][2]string {
	// One socket event per progress of a tcp interface: UCX handles a
	// batch of epoll events one after the other, and handling one (a
	// connection reset) can close another endpoint of the same batch,
	// whose event then fails UCX's assertion that its endpoint is not
	// closed and aborts the process (tcp_iface.c, 1.13 to at least 1.18;
	// a decode resumed after its prefill gave it up). Events of a closed
	// endpoint leave the epoll set with it, so a batch of one cannot hold
	// a stale one.
	var d [][2]string
	if usesTCP(o.tls()) {
		d = append(d, [2]string{"TCP_MAX_POLL", "1"})
	}
	if ib, _ := os.ReadDir("/sys/class/infiniband"); len(ib) > 0 {
		d = append(d, [2]string{"IB_REG_METHODS", "direct"})
	}
	return slices.DeleteFunc(d, func(kv [2]string) bool {
		_, set := o.Config[kv[0]]
		return set
	})
}

// cGetenv is name's value in the C environment, which UCX reads (Go's
// os.Getenv does not see what C's setenv changed).
func cGetenv(name string) string {
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	v := C.getenv(n)
	if v == nil {
		return ""
	}
	return C.GoString(v)
}

// tls is the UCX_TLS value the context reads: Options.Config's, else the
// environment's.
func (o Options) tls() string {
	if tls, ok := o.Config["TLS"]; ok {
		return tls
	}
	return os.Getenv("UCX_TLS")
}

// usesSharedMemory reports whether a UCX_TLS value may select UCX's
// shared-memory (mm) transports: posix or sysv, which sm, shm and mm name
// together.
func usesSharedMemory(tls string) bool {
	return tlsMaySelect(tls, []string{"sm", "shm", "mm"}, "posix", "sysv")
}

// usesTCP reports whether a UCX_TLS value may select UCX's tcp transport.
func usesTCP(tls string) bool { return tlsMaySelect(tls, []string{"tcp"}) }

// tlsMaySelect reports whether a UCX_TLS value may select one of the
// transports parts, which each of groups names together ("all" too): an
// unset value may select any; "^..." (all but those listed) any unless it
// lists a group, or every part.
func tlsMaySelect(tls string, groups []string, parts ...string) bool {
	if tls == "" {
		return true
	}
	except := strings.HasPrefix(tls, "^")
	listed := map[string]bool{}
	for _, name := range strings.Split(strings.TrimPrefix(tls, "^"), ",") {
		listed[strings.TrimPrefix(name, `\`)] = true
	}
	anyListed := func(names []string) bool {
		return slices.ContainsFunc(names, func(n string) bool { return listed[n] })
	}
	if except {
		allParts := len(parts) > 0 && !slices.ContainsFunc(parts, func(n string) bool { return !listed[n] })
		return !anyListed(groups) && !allParts
	}
	return listed["all"] || anyListed(groups) || anyListed(parts)
}

// Transport is one UCP context and worker, driven by one progress
// goroutine.
type Transport struct {
	opts    Options
	ctx     *C.kvs_ctx_t // immutable after New; destroyed by the progress goroutine
	addr    []byte
	loopG   uint64 // goroutine id of the progress goroutine
	stopped chan struct{}
	queued  atomic.Int32  // len(queue), readable without the lock
	flushes atomic.Uint64 // batch flushes issued (one per group of batches)

	mu        sync.Mutex
	closed    bool
	sleeping  bool   // the progress goroutine sleeps in kvs_wait: wake it
	queue     []item // work for the progress goroutine, in order
	regions   map[rdma.LocalKey]*region
	nextKey   rdma.LocalKey
	free      []*batch // batches ready for reuse
	nextBatch uint64
	reqs      []*C.kvs_req_t // every batch record, freed after the worker
	// epochs counts, per address this transport connects to, the
	// endpoints to it that broke (doc.go, "Epochs"). An entry goes with
	// its last endpoint unless one broke: the receiver's fence outlives
	// the endpoints.
	epochs map[string]*epochs

	// Owned by the progress goroutine.
	spare    []item
	released []*batch
	eps      map[uint64]*Endpoint
	nextEp   uint64
	slots    []*batch      // batch records by slot, once started (see inFlight)
	live     int           // batches started and not reported yet
	draining int           // endpoints in epDraining
	woke     bool          // a done callback ran since the last yield
	eprecs   []*C.kvs_ep_t // every endpoint record, freed after the worker
	evbuf    []C.kvs_event_t
	// pending are the events kvs_poll returned, handled in order from
	// pendingAt (pollOnce), by a nested pollOnce too.
	pending   []C.kvs_event_t
	pendingAt int
	stopping  bool
	// Scratch of startGroup and flushed.
	group, gdone []*batch
	flushDepth   int // flushed calls under way (a done callback's Close nests one)
	gws          []C.kvs_write_t
	gcounts      []C.uint32_t
	gerrs        []C.int32_t
	accesses     map[*access]struct{} // open peer access points
	retiring     []retiree            // revoked, destroyed after their linger

	// direct: the transports UCX may use let a peer write this side's
	// memory itself (see mayWriteDirectly); set by New.
	direct bool
	tls    string // UCX_TLS as this transport's context reads it ("" when unset)
	// accessIP is what access points listen on (Options.AccessHost);
	// invalid where they give out worker addresses instead.
	accessIP netip.Addr
}

// item is one unit of work for the progress goroutine: a batch to post or a
// function to run there.
type item struct {
	b  *batch
	fn func()
}

var _ rdma.Transport = (*Transport)(nil)

// ErrClosed marks operations on a closed Transport.
var ErrClosed = errors.New("ucx: transport closed")

// New creates a UCP context and worker and starts the progress goroutine.
// UCX reads its UCX_* environment variables now.
func New(opts Options) (*Transport, error) {
	if opts.Spin == 0 {
		opts.Spin = 50 * time.Microsecond
	}
	if opts.CloseDrain == 0 {
		opts.CloseDrain = 5 * time.Second
	}
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = 10 * time.Second
	}
	if opts.Writes != WriteMessages && opts.Writes != WriteRMA {
		return nil, errors.Mark(errors.Newf("ucx: Options.Writes %v unknown (want WriteMessages or WriteRMA)", opts.Writes), rdma.ErrInvalidWrite)
	}
	if opts.Fragment == 0 {
		opts.Fragment = DefaultFragment
	}
	if opts.RevokeLinger == 0 {
		opts.RevokeLinger = 2 * time.Second
	}
	if opts.Fragment > MaxFragment {
		return nil, errors.Mark(errors.Newf("ucx: Options.Fragment %d: at most %d", opts.Fragment, MaxFragment), rdma.ErrInvalidWrite)
	}
	t := &Transport{
		opts:     opts,
		stopped:  make(chan struct{}),
		regions:  map[rdma.LocalKey]*region{},
		eps:      map[uint64]*Endpoint{},
		evbuf:    make([]C.kvs_event_t, 256),
		accesses: map[*access]struct{}{},
		epochs:   map[string]*epochs{},
	}
	t.tls = opts.tls()
	if opts.AccessConnect < AccessAuto || opts.AccessConnect > AccessWorkerAddress {
		return nil, errors.Mark(errors.Newf("ucx: Options.AccessConnect %d unknown (want AccessAuto, AccessListener or AccessWorkerAddress)", opts.AccessConnect), rdma.ErrEndpointBroken)
	}
	// A bad AccessHost is refused whether or not this UCX listens: the
	// same options must not pass on one release and fail on another.
	ip, err := accessHost(opts.AccessHost)
	if err != nil {
		return nil, errors.Mark(err, rdma.ErrEndpointBroken)
	}
	if opts.AccessConnect.listens(opts.Writes, t.tls, ucxVersion()) {
		t.accessIP = ip
	}
	// A peer writes this side's memory itself only through UCX's RMA.
	t.direct = opts.Writes == WriteRMA && mayWriteDirectly(t.tls)
	initDone := make(chan error, 1)
	go t.run(initDone)
	if err := <-initDone; err != nil {
		<-t.stopped
		return nil, err
	}
	return t, nil
}

// config merges defaults, then the caller's overrides, into UCX keys and
// values; a default yields to the same variable in the environment.
func (o Options) config() (keys, vals []string) {
	set := map[string]string{}
	for _, d := range o.defaults() {
		if _, ok := os.LookupEnv("UCX_" + d[0]); !ok {
			set[d[0]] = d[1]
		}
	}
	for k, v := range o.Config {
		set[k] = v
	}
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic, for error messages
	for _, k := range keys {
		vals = append(vals, set[k])
	}
	return keys, vals
}

// initContext runs on the progress goroutine, like every other UCP call.
func (t *Transport) initContext() error {
	keys, vals := t.opts.config()
	ck := make([]*C.char, len(keys)+1)
	cv := make([]*C.char, len(vals)+1)
	// The arrays of C strings live in C memory: a Go array of pointers may
	// not be passed to C.
	ckeys := (**C.char)(C.calloc(C.size_t(len(ck)), C.size_t(unsafe.Sizeof(ck[0]))))
	cvals := (**C.char)(C.calloc(C.size_t(len(cv)), C.size_t(unsafe.Sizeof(cv[0]))))
	defer C.free(unsafe.Pointer(ckeys))
	defer C.free(unsafe.Pointer(cvals))
	ks := unsafe.Slice(ckeys, len(ck))
	vs := unsafe.Slice(cvals, len(cv))
	for i := range keys {
		ks[i], vs[i] = C.CString(keys[i]), C.CString(vals[i])
		defer C.free(unsafe.Pointer(ks[i]))
		defer C.free(unsafe.Pointer(vs[i]))
	}
	name := C.CString(t.opts.Name)
	defer C.free(unsafe.Pointer(name))
	wakeup := C.int(1)
	if t.opts.NoWakeup {
		wakeup = 0
	}
	rma := C.int(0)
	if t.opts.Writes == WriteRMA {
		rma = 1
	}
	for _, kv := range t.opts.envDefaults() {
		k, v := C.CString("UCX_"+kv[0]), C.CString(kv[1])
		C.kvs_setenv_default(k, v)
		C.free(unsafe.Pointer(k))
		C.free(unsafe.Pointer(v))
	}
	var ctx *C.kvs_ctx_t
	st := C.kvs_init(&ctx, ckeys, cvals, C.int(len(keys)), wakeup, rma, C.uint64_t(t.opts.Fragment), name)
	if st != C.UCS_OK {
		return statusErr(st, "ucx: init (config %v=%v)", keys, vals)
	}
	t.ctx = ctx
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.kvs_address(ctx.worker, &buf, &n); st != C.UCS_OK {
		C.kvs_destroy(ctx)
		t.ctx = nil
		return statusErr(st, "ucx: worker address")
	}
	t.addr = C.GoBytes(buf, C.int(n))
	C.free(buf)
	return nil
}

// Name returns "ucx".
func (t *Transport) Name() string { return "ucx" }

// sendByRendezvous makes t send its message writes, FLUSHes and their
// answers by UCX's rendezvous protocol, as no kvstream peer does: tests
// play a hostile peer with it. Call it before t posts or is written to.
func (t *Transport) sendByRendezvous() { t.ctx.am_proto = C.UCP_AM_SEND_FLAG_RNDV }

// Address returns the worker address, for peers to Connect to.
func (t *Transport) Address() []byte { return t.addr }

// onLoop reports whether the caller is the progress goroutine, where done
// callbacks run and may call back in: waiting for the progress goroutine
// there would deadlock, so work runs inline instead. Only control paths ask
// (never Post), so the cost of reading the goroutine id is fine.
func (t *Transport) onLoop() bool { return goid() == t.loopG }

// goid returns the current goroutine's id, parsed from the first line of its
// stack trace ("goroutine 42 [running]:"): the runtime exposes it no other
// way.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = b[len("goroutine "):]
	var id uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

// enqueueLocked hands work to the progress goroutine. t.mu is held; waking
// under the lock keeps the worker alive for the signal (it is destroyed only
// after closed is set under the same lock).
func (t *Transport) enqueueLocked(it item) {
	t.queue = append(t.queue, it)
	t.queued.Store(int32(len(t.queue)))
	if t.sleeping {
		t.sleeping = false
		if !t.opts.NoWakeup { // no event fd: the nap's timeout wakes it
			C.kvs_signal(t.ctx)
		}
	}
}

// do runs fn on the progress goroutine and returns its error: inline when
// called from there, else through the queue.
func (t *Transport) do(fn func() error) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errors.Mark(ErrClosed, rdma.ErrEndpointBroken)
	}
	if t.onLoop() {
		t.mu.Unlock()
		return fn()
	}
	ch := make(chan error, 1)
	t.enqueueLocked(item{fn: func() { ch <- fn() }})
	t.mu.Unlock()
	return <-ch
}

// Close closes every endpoint (failing their unfinished batches), unmaps
// every region, destroys the worker and the context, and stops the progress
// goroutine. Called from a done callback it only starts the teardown, which
// completes when the callback returns.
func (t *Transport) Close() error {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		t.enqueueLocked(item{fn: func() { t.stopping = true }})
	}
	t.mu.Unlock()
	if t.onLoop() {
		t.stopping = true
		return nil
	}
	<-t.stopped
	return nil
}

// run is the progress goroutine. It is not locked to an OS thread: the
// worker is created UCS_THREAD_MODE_SERIALIZED, which allows calls from any
// thread one at a time, and one goroutine makes them all. Staying unlocked
// keeps runtime.Gosched cheap, which matters below.
func (t *Transport) run(initDone chan<- error) {
	defer close(t.stopped)
	t.loopG = goid()
	if err := t.initContext(); err != nil {
		initDone <- err
		return
	}
	initDone <- nil

	var idleSince time.Time
	for {
		busy := false
		if t.queued.Load() > 0 || len(t.released) > 0 {
			busy = t.drainQueue()
		}
		if t.pollOnce(t.evbuf) {
			busy = true
		}
		if len(t.retiring) > 0 {
			t.retire(time.Now())
		}
		if t.stopping {
			// Close from a done callback stops the loop at once: the work
			// queued before it set closed (batches Post accepted, a
			// Deregister's unmap, a Revoke) still runs, as it does before
			// the stop item of a Close from outside, or its caller would
			// wait for ever. Nothing is queued once closed is set.
			for t.queued.Load() > 0 {
				t.drainQueue()
			}
			t.teardown()
			return
		}
		if t.woke {
			// A done callback usually wakes a goroutine, which the
			// runtime queues on this goroutine's P. Spinning on would
			// keep it waiting until preemption (10ms), so yield.
			t.woke = false
			runtime.Gosched()
		}
		if busy {
			idleSince = time.Time{}
			continue
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if time.Since(idleSince) < t.opts.Spin {
			continue
		}
		t.sleep()
		idleSince = time.Time{}
	}
}

// drainQueue takes the queued work (returning released batches to the free
// list on the way) and performs it in order.
func (t *Transport) drainQueue() bool {
	t.mu.Lock()
	q := t.queue
	t.queue = t.spare[:0]
	t.queued.Store(0)
	t.free = append(t.free, t.released...)
	t.mu.Unlock()
	clear(t.released)
	t.released = t.released[:0]
	for i := 0; i < len(q); {
		if q[i].b == nil {
			q[i].fn()
			q[i] = item{}
			i++
			continue
		}
		// Batches queued one after the other for one endpoint go out
		// with one flush.
		ep, group := q[i].b.ep, t.group[:0]
		for ; i < len(q) && q[i].b != nil && q[i].b.ep == ep && len(group) < maxGroup; i++ {
			group = append(group, q[i].b)
			q[i] = item{}
		}
		t.startGroup(group)
		clear(group)
		t.group = group[:0]
	}
	t.spare = q[:0]
	return len(q) > 0
}

// Sleep timeouts of the progress loop: safety nets against a transport that
// signals no event for some progress.
const (
	idleNap = 100 * time.Millisecond
	busyNap = 50 * time.Microsecond
)

// sleep waits on the worker's event fd until UCX or a producer wakes it, or
// the nap ends.
func (t *Transport) sleep() {
	t.mu.Lock()
	if len(t.queue) > 0 {
		t.mu.Unlock()
		return
	}
	t.sleeping = true
	t.mu.Unlock()
	timeout := idleNap
	if t.live > 0 || t.draining > 0 || t.opts.NoWakeup {
		// Not every transport signals the event fd when queued sends can
		// proceed (shared-memory FIFO space freed by the receiver): with
		// work outstanding, only nap. Without an event fd, nothing but
		// the timeout ends a sleep.
		timeout = busyNap
	}
	C.kvs_wait(t.ctx, C.long(timeout.Microseconds()))
	t.mu.Lock()
	t.sleeping = false
	t.mu.Unlock()
}

// pollOnce progresses the worker and handles the events it produced. buf is
// the caller's: nested calls (a done callback closing an endpoint) use their
// own. The events go through t.pending, which a nested call handles first:
// an event behind the one whose callback closes an endpoint (the end of
// that endpoint's drain) may be what the nested call waits for.
func (t *Transport) pollOnce(buf []C.kvs_event_t) bool {
	k := uint32(C.kvs_poll(t.ctx, &buf[0], C.unsigned(len(buf)), 16))
	n := t.ctx.progressed
	oom := k&0x80000000 != 0
	k &^= 0x80000000
	t.pending = append(t.pending, buf[:k]...)
	for t.pendingAt < len(t.pending) {
		ev := t.pending[t.pendingAt]
		t.pendingAt++
		t.handle(uint64(ev.id), uint64(ev.aux), int(ev.kind), C.ucs_status_t(ev.status))
	}
	t.pending, t.pendingAt = t.pending[:0], 0
	if oom {
		// An event was lost: some batch would never complete. Fail
		// closed: tear every endpoint down.
		for _, e := range t.eps {
			t.broke(e) // forced closed with writes possibly in flight
			t.startClose(e, errors.New("ucx: out of memory queueing a completion"), true)
		}
	}
	t.checkDrains()
	return n > 0 || k > 0
}

func (t *Transport) handle(id, aux uint64, kind int, st C.ucs_status_t) {
	switch kind {
	case C.KVS_EV_BATCH:
		if b := t.inFlight(id); b != nil {
			t.flushDone(b, st)
		} // else already failed by its endpoint's teardown
	case C.KVS_EV_ACK, C.KVS_EV_ACK_FENCED:
		// Only the peer the FLUSH went to can answer it: a tag that names
		// no batch in flight, or an answer that came back on another
		// endpoint, completes nothing.
		if b := t.inFlight(id); b != nil && b.needAck && !b.acked && aux == uint64(uintptr(unsafe.Pointer(b.ep.rec.ep))) {
			if kind == C.KVS_EV_ACK_FENCED {
				b.ep.epochs.fenced.Store(true)
			}
			t.ackDone(b, st)
		}
	case C.KVS_EV_FENCE:
		// A stale refusal says where the receiver's fence is: epochs
		// counted by another sender to the same access point (several
		// transports of one peer) raised it. Later groups carry at least
		// that epoch, so a re-send is not refused again.
		if b := t.inFlight(id); b != nil && b.needAck && !b.acked && aux == uint64(uintptr(unsafe.Pointer(b.ep.rec.ep))) {
			b.ep.epochs.atLeast(uint32(st))
		}
	case C.KVS_EV_EP_ERROR:
		// UCX requires a failed endpoint to be closed, and there is
		// nothing to drain.
		if e := t.eps[id]; e != nil && st == C.UCS_ERR_REJECTED {
			// The access point's listener refused the connection
			// (revoked, or at its limit): nothing of it was applied.
			// Marked as a refused flush is (flushed): a revocation,
			// whichever of the two reports first.
			t.startClose(e, errors.Mark(errors.Mark(statusErr(st, "ucx: endpoint %d: the peer refused the connection", id), rdma.ErrEndpointBroken), rdma.ErrRevoked), true)
		} else if e != nil {
			t.endpointFailed(e, statusErr(st, "ucx: endpoint %d failed", id))
		}
	case C.KVS_EV_EP_DRAINED:
		if e := t.eps[id]; e != nil && e.lstate == epDraining {
			e.drainFlushed = true
			t.maybeDrained(e)
		}
	case C.KVS_EV_EP_CLOSED:
		if e := t.eps[id]; e != nil {
			t.finishClose(e)
		}
	}
}

// endpointFailed closes e, whose connection failed, and counts it in its
// address's epochs (broke).
func (t *Transport) endpointFailed(e *Endpoint, reason error) {
	t.broke(e)
	t.startClose(e, reason, true)
}

// complete reports a batch. A batch whose flush may still call back keeps
// its C record out of reuse (reusable false).
func (t *Transport) complete(b *batch, err error, reusable bool) {
	if err != nil && b.ep != nil && errors.Is(b.ep.closeErr, rdma.ErrNotQuiesced) {
		// Failed by a forced close after the drain timed out (its flush
		// cancelled, or the endpoint released), or on a connection that
		// broke: its writes may still land, and whoever owns its
		// destination must hear that, not only the caller of Close
		// (another chunk may have closed it).
		err = errors.Mark(errors.Wrapf(err, "%v", b.ep.closeErr), rdma.ErrNotQuiesced)
		if errors.Is(b.ep.closeErr, rdma.ErrFenced) {
			err = errors.Mark(err, rdma.ErrFenced)
		}
	}
	done := b.done
	b.done, b.ep = nil, nil
	t.woke = true
	if reusable {
		t.released = append(t.released, b)
	}
	done(err)
}

// progressUntil progresses the worker from the progress goroutine itself
// (Close called from a done callback, or teardown) until cond holds or
// timeout passes.
func (t *Transport) progressUntil(cond func() bool, timeout time.Duration) bool {
	buf := make([]C.kvs_event_t, 64)
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		if !t.pollOnce(buf) && !cond() {
			C.kvs_wait(t.ctx, C.long(busyNap.Microseconds()))
		}
	}
	return true
}

// teardown runs on the progress goroutine once Close was called and every
// earlier queued item ran.
func (t *Transport) teardown() {
	reason := errors.Mark(ErrClosed, rdma.ErrEndpointBroken)
	for _, e := range t.eps {
		t.startClose(e, reason, false)
	}
	t.progressUntil(func() bool { return len(t.eps) == 0 }, max(t.opts.CloseDrain, 0)+t.opts.CloseTimeout)
	for _, e := range t.eps { // close never completed: abandon
		t.finishClose(e)
	}
	for _, b := range t.slots { // batches of endpoints closed earlier
		if b != nil && b.live {
			t.setLive(b, false)
			t.complete(b, errors.Mark(errors.Wrapf(reason, "ucx: batch %d", b.id), rdma.ErrEndpointBroken), false)
		}
	}
	t.mu.Lock()
	regions := t.regions
	t.regions = map[rdma.LocalKey]*region{}
	t.mu.Unlock()
	for a := range t.accesses { // kvs_destroy destroys their workers
		a.w, a.wk = nil, nil
	}
	clear(t.accesses)
	for _, r := range t.retiring {
		r.a.w, r.a.wk = nil, nil
	}
	t.retiring = nil
	for _, r := range regions {
		C.kvs_mem_unmap(t.ctx, r.memh)
	}
	C.kvs_destroy(t.ctx)
	t.ctx = nil
	// No UCX callback can refer to these records any more.
	t.mu.Lock()
	reqs := t.reqs
	t.reqs, t.free, t.slots = nil, nil, nil
	t.mu.Unlock()
	for _, r := range reqs {
		C.kvs_req_free(r)
	}
	for _, r := range t.eprecs {
		C.free(unsafe.Pointer(r))
	}
	t.eprecs = nil
}

// statusErr formats a UCX status.
func statusErr(st C.ucs_status_t, format string, args ...any) error {
	return errors.Newf(format+": %s", append(args, C.GoString(C.ucs_status_string(st)))...)
}
