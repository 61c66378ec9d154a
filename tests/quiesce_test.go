package tests

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/internal/stacks"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wrapping is a rig option that wraps every endpoint the engine's transport
// connects.
func wrapping(wrap func(rdma.Endpoint) rdma.Endpoint) func(rdma.Transport) rdma.Transport {
	return func(t rdma.Transport) rdma.Transport { return wrappedTransport{Transport: t, wrap: wrap} }
}

type wrappedTransport struct {
	rdma.Transport
	wrap func(rdma.Endpoint) rdma.Endpoint
}

func (t wrappedTransport) Connect(a []byte) (rdma.Endpoint, error) {
	ep, err := t.Transport.Connect(a)
	if err != nil {
		return nil, err
	}
	return t.wrap(ep), nil
}

// unquiesced counts the Closes of endpoints that cannot guarantee
// quiescence, as UCX over TCP or shared memory reports when its drain times
// out (a stalled peer): Close returns an error marked ErrNotQuiesced, and
// so do the batches it fails (the rdma.Endpoint contract).
type unquiesced struct{ closes, posts atomic.Int32 }

func (u *unquiesced) wrap(ep rdma.Endpoint) rdma.Endpoint {
	return &unquiescedEndpoint{Endpoint: ep, t: u}
}

type unquiescedEndpoint struct {
	rdma.Endpoint
	t       *unquiesced
	closing atomic.Bool
}

func (e *unquiescedEndpoint) Post(ws []rdma.Write, done func(error)) error {
	err := e.Endpoint.Post(ws, func(err error) {
		if err != nil && e.closing.Load() {
			err = errors.Mark(errors.Wrap(err, "forced closed, may still land"), rdma.ErrNotQuiesced)
		}
		done(err)
	})
	if err == nil {
		e.t.posts.Add(1)
	}
	return err
}

func (e *unquiescedEndpoint) Close() error {
	e.t.closes.Add(1)
	e.closing.Store(true)
	_ = e.Endpoint.Close()
	return errors.Mark(errors.New("drain timed out; forced closed, writes may still land"), rdma.ErrNotQuiesced)
}

// posted waits until n batches were posted. The finish timeout starts at
// Finish, and only batches in flight give its teardown an endpoint to
// close that cannot quiesce: a starved process used to reach the 250 ms
// with the forward's batches not posted yet (work 0/2 processed), and the
// teardown then had nothing to report.
func (u *unquiesced) posted(t *testing.T, n int32) {
	t.Helper()
	require.Eventually(t, func() bool { return u.posts.Load() >= n }, 10*time.Second, time.Millisecond,
		"the forward's %d batches were never all posted", n)
}

// decodePage maps a batch's first destination to its page on decode pool 0.
func decodePage(r *rig, g testbed.Geometry, dst uint64) uint64 {
	per := g.ItemLen * uint64(g.Pages)
	return ((dst - r.decodes[0].Bases[0]) % per) / g.ItemLen
}

// TestDropReportsNotQuiesced: a Drop whose chunks' teardown could not
// quiesce must say so, as Finish does; it used to return nil, and its caller
// would reuse pages that writes may still hit.
func TestDropReportsNotQuiesced(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	tr := &unquiesced{}
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, timeout: 250 * time.Millisecond,
		wrap:      wrapping(tr.wrap),
		netFaults: func(rdmafault.BatchInfo) rdmafault.Fault { return rdmafault.Fault{Kind: rdmafault.LoseCompletion} }})
	r.register(chunk{room: 1, end: 8, src: []int{0, 1}, total: 4, infos: oneInfo("d0", []int{0, 1, 2, 3})})
	r.register(chunk{room: 2, end: 8, src: []int{4, 5}, total: 4, infos: oneInfo("d0", []int{10, 11, 12, 13})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8}, testbed.Write{Room: 2, SrcPages: []int{4, 5}, Tokens: 8})
	tr.posted(t, 4)
	_, err := r.eng.Finish(context.Background(), 1)
	assert.True(t, errors.Is(err, system.ErrNotQuiesced), "Finish: %v", err)
	err = r.eng.Drop(context.Background(), 2)
	assert.True(t, errors.Is(err, system.ErrNotQuiesced), "Drop: %v", err)
	require.Positive(t, tr.closes.Load(), "a teardown closed an endpoint")
}

// TestNotQuiescedReachesOtherChunks: chunk A's teardown closes the endpoint
// that also carries chunk B's batch, and that Close could not quiesce. B's
// answer must carry ErrNotQuiesced too: B's pages are as unsafe as A's.
func TestNotQuiescedReachesOtherChunks(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	tr := &unquiesced{}
	var r *rig
	r = newRig(t, rigOpts{geom: g, hooks: 4, group: 2, timeout: 250 * time.Millisecond, submitters: 1,
		wrap: wrapping(tr.wrap),
		netFaults: func(b rdmafault.BatchInfo) rdmafault.Fault {
			if decodePage(r, g, b.Dst) < 10 {
				return rdmafault.Fault{Kind: rdmafault.LoseCompletion} // room 1 times out
			}
			return rdmafault.Fault{Kind: rdmafault.DelayCompletion, Delay: 3 * time.Second} // room 2: in flight
		}})
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.register(chunk{room: 2, end: 8, last: true, src: []int{4, 5}, total: 2, infos: oneInfo("d0", []int{10, 11})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8}, testbed.Write{Room: 2, SrcPages: []int{4, 5}, Tokens: 8})
	tr.posted(t, 4)
	_, err := r.eng.Finish(context.Background(), 1)
	require.True(t, errors.Is(err, system.ErrNotQuiesced), "A: %v", err)
	res, err := r.eng.Finish(context.Background(), 2)
	require.Equal(t, system.Failed, res.Status, "%v", err)
	assert.True(t, errors.Is(err, system.ErrNotQuiesced), "B: %v", err)
}

// overlap records how many endpoint Closes run at once. Each Close holds
// until a second one has started (together is closed) or the test releases
// it: closes made together all go on as soon as the second one starts,
// however late the scheduler runs it, while closes made one after another
// leave the first one held, with a maximum of 1, until the test gives up.
type overlap struct {
	inClose, most, closes atomic.Int32
	together, release     chan struct{}
	once                  sync.Once
}

func newOverlap() *overlap {
	return &overlap{together: make(chan struct{}), release: make(chan struct{})}
}

func (o *overlap) wrap(ep rdma.Endpoint) rdma.Endpoint { return &overlapEndpoint{Endpoint: ep, t: o} }

type overlapEndpoint struct {
	rdma.Endpoint
	t *overlap
}

func (e *overlapEndpoint) Close() error {
	n := e.t.inClose.Add(1)
	defer e.t.inClose.Add(-1)
	e.t.closes.Add(1)
	for m := e.t.most.Load(); n > m && !e.t.most.CompareAndSwap(m, n); m = e.t.most.Load() {
	}
	if n >= 2 {
		e.t.once.Do(func() { close(e.t.together) })
	}
	select {
	case <-e.t.together:
	case <-e.t.release:
	}
	return e.Endpoint.Close()
}

// TestTeardownClosesEndpointsTogether: a timed-out chunk whose batches are
// in flight on several submitters' endpoints closes them concurrently, so
// that the teardown costs one Close's drain, not their sum (invariant 9).
// The chunk is dropped, not finished: a finishing chunk would resume its
// lost completions at their deadline, closing their endpoints itself
// before any teardown.
func TestTeardownClosesEndpointsTogether(t *testing.T) {
	g := testbed.MLA(8, 16, 64)
	tr := newOverlap()
	r := newRig(t, rigOpts{geom: g, hooks: 8, group: 1, timeout: 250 * time.Millisecond, submitters: 4,
		wrap:      wrapping(tr.wrap),
		netFaults: func(rdmafault.BatchInfo) rdmafault.Fault { return rdmafault.Fault{Kind: rdmafault.LoseCompletion} }})
	// Registered after the rig's: runs before the engine's Close, whose
	// endpoint Closes must not be held when this test failed.
	var released sync.Once
	release := func() { released.Do(func() { close(tr.release) }) }
	t.Cleanup(release)
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	require.Eventually(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.landings) >= 8 },
		5*time.Second, time.Millisecond, "the forward's batches were not all posted")
	// The drop's teardown closes the endpoints of the batches that never
	// complete (the round-robin router put them on all four submitters).
	dropped := make(chan error, 1)
	go func() { dropped <- r.eng.Drop(context.Background(), 1) }()
	// Closes made together meet as soon as the second one starts; the
	// bound only ends a test whose first Close waits for a second that
	// never comes while it is open (closes one after another): no
	// scheduler delays a started goroutine by half a minute.
	var err error
	returned := false
	select {
	case <-tr.together:
	case err = <-dropped:
		returned = true
	case <-time.After(30 * time.Second):
	}
	release()
	if !returned {
		err = <-dropped
	}
	require.GreaterOrEqual(t, tr.closes.Load(), int32(2), "the chunk's batches were in flight on several endpoints")
	assert.GreaterOrEqual(t, tr.most.Load(), int32(2), "endpoint closes ran one after another")
	require.NoError(t, err) // one after another, the held first Close outlasts the Drop's bound
}

// heldClose makes every endpoint Close block until release is closed;
// closing is closed when the first one starts.
type heldClose struct {
	closing, release chan struct{}
	once             sync.Once
}

func (h *heldClose) wrap(ep rdma.Endpoint) rdma.Endpoint {
	return &heldCloseEndpoint{Endpoint: ep, t: h}
}

type heldCloseEndpoint struct {
	rdma.Endpoint
	t *heldClose
}

func (e *heldCloseEndpoint) Close() error {
	e.t.once.Do(func() { close(e.t.closing) })
	<-e.t.release
	return e.Endpoint.Close()
}

// TestSecondEngineCloseWaits: a second, concurrent Engine.Close returns only
// once the first one has torn everything down, since its caller too may
// free the memory that the rooms' writes target.
func TestSecondEngineCloseWaits(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	tr := &heldClose{closing: make(chan struct{}), release: make(chan struct{})}
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, timeout: 500 * time.Millisecond,
		wrap:      wrapping(tr.wrap),
		netFaults: func(rdmafault.BatchInfo) rdmafault.Fault { return rdmafault.Fault{Kind: rdmafault.LoseCompletion} }})
	var released sync.Once
	release := func() { released.Do(func() { close(tr.release) }) }
	t.Cleanup(release) // before the rig's engine Close, on a failure
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	// A batch in flight (landed, its completion lost): dropping the room
	// must close its endpoint.
	require.Eventually(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.landings) > 0 },
		5*time.Second, time.Millisecond, "no batch was posted")
	first, second := make(chan struct{}), make(chan struct{})
	go func() { _ = r.eng.Close(); close(first) }()
	<-tr.closing // the first Close is tearing the room down, held there
	go func() { _ = closeAgain(r.eng); close(second) }()
	// The second Close must park inside Engine.Close, not return: seen on
	// its goroutine's stack, whenever the scheduler gets to run it. The
	// bound only ends a test whose second Close neither returned nor
	// parked there.
	deadline := time.Now().Add(time.Minute)
	for !blockedIn("tests.closeAgain(", "system.(*Engine).Close(") {
		select {
		case <-second:
			release()
			t.Fatal("a second Close returned while the first was still tearing down")
		default:
		}
		if time.Now().After(deadline) {
			release()
			t.Fatal("the second Close neither returned nor waited inside Engine.Close")
		}
		time.Sleep(100 * time.Microsecond)
	}
	release()
	<-first
	<-second
}

// closeAgain is the second Close's own frame, which tells its goroutine
// from the first one's on a stack dump.
//
//go:noinline
func closeAgain(e *system.Engine) error { return e.Close() }

// blockedIn reports whether a goroutine whose stack holds frame is parked
// with top as its innermost function outside the runtime's: parked there,
// not somewhere it calls.
func blockedIn(frame, top string) bool {
	return stacks.Blocked(frame, func(g stacks.Goroutine) bool { return strings.Contains(g.Innermost(), top) })
}

// postSignal wraps endpoints so that a test learns when a batch was posted.
type postSignal struct{ posted chan struct{} }

func (s postSignal) wrap(ep rdma.Endpoint) rdma.Endpoint {
	return postSignalEndpoint{Endpoint: ep, s: s}
}

type postSignalEndpoint struct {
	rdma.Endpoint
	s postSignal
}

func (e postSignalEndpoint) Post(ws []rdma.Write, done func(error)) error {
	err := e.Endpoint.Post(ws, done)
	select {
	case e.s.posted <- struct{}{}:
	default:
	}
	return err
}

// TestDropWaitsForTheChunkBeingFinished: Drop while a Finish of the same
// room waits on a slow transfer used to return at once (the room drained
// only its queue, which the finishing chunk had left); the write landed
// 300 ms later and the Finish reported SUCCESS. A returned Drop must mean
// nothing of the room can land any more, and that Finish says DROPPED.
func TestDropWaitsForTheChunkBeingFinished(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	sig := postSignal{posted: make(chan struct{}, 1)}
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, link: loopback.Options{Latency: 300 * time.Millisecond},
		wrap: wrapping(sig.wrap)})
	r.register(chunk{room: 1, end: 8, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})

	// No forward: the chunk sends everything when Finish pops it, so the
	// post proves the Finish took the chunk out of the room's queue.
	type answer struct {
		res system.Result
		err error
	}
	finished := make(chan answer, 1)
	go func() {
		res, err := r.eng.Finish(context.Background(), 1)
		finished <- answer{res, err}
	}()
	select {
	case <-sig.posted:
	case <-time.After(5 * time.Second):
		t.Fatal("the Finish posted nothing")
	}
	require.NoError(t, r.eng.Drop(context.Background(), 1))
	dropped := time.Now()

	r.mu.Lock()
	landings := append([]loopback.Landing(nil), r.landings...)
	r.mu.Unlock()
	require.NotEmpty(t, landings, "Drop returned before the in-flight write landed")
	for _, l := range landings {
		assert.False(t, l.At.After(dropped), "a write landed %v after Drop returned", l.At.Sub(dropped))
	}
	a := <-finished
	assert.Equal(t, system.Dropped, a.res.Status, "a Finish whose chunk was dropped never says SUCCESS")
	assert.True(t, errors.Is(a.err, system.ErrDropped), "%v", a.err)
}

// TestPeerLostFailsInFlightChunksAtOnce: a decode peer declared lost (its
// heartbeats stopped) used to fail only work not yet posted; a chunk whose
// batch was in flight to the hung peer waited out its whole finish timeout.
// PeerLost now closes the submitters' endpoints to it, so the batch fails
// and the chunk answers FAILED at once, quiesced.
func TestPeerLostFailsInFlightChunksAtOnce(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	sig := postSignal{posted: make(chan struct{}, 1)}
	// The link holds every batch for ten minutes: only the endpoint's close
	// can end it within the test.
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, timeout: 10 * time.Minute,
		link: loopback.Options{Latency: 10 * time.Minute}, wrap: wrapping(sig.wrap)})
	r.register(chunk{room: 1, end: 8, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	finished := make(chan error, 1)
	go func() {
		_, err := r.eng.Finish(context.Background(), 1)
		finished <- err
	}()
	select {
	case <-sig.posted:
	case <-time.After(time.Minute):
		t.Fatal("the Finish posted nothing")
	}
	require.NoError(t, r.eng.PeerLost("d0", errors.New("heartbeats stopped")))
	select {
	case err := <-finished:
		require.Error(t, err)
		assert.True(t, errors.Is(err, system.ErrEndpointBroken), "%v", err)
	case <-time.After(time.Minute): // the link would hold it for ten
		t.Fatal("the chunk waited for its batch to the lost peer")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Empty(t, r.landings, "nothing landed on the lost peer")
}

// TestSecondCancelWaitsForTheFirstDrop: a room toward two decode peers (the
// ranks of a decode TP group each cancel the room toward themselves) whose
// chunk has writes in flight is cancelled by one peer, then by the other
// while the first cancel's drop still quiesces. The second cancel used to
// return nil at once (the room's queue was empty, so "no chunk toward the
// peer"), and the decode freed its pages while the chunk's writes to it
// still landed. It must return only once nothing lands there any more.
func TestSecondCancelWaitsForTheFirstDrop(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	sig := postSignal{posted: make(chan struct{}, 1)}
	heard := make(chan string, 2)
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, decodes: 2, link: loopback.Options{Latency: 300 * time.Millisecond},
		wrap: wrapping(sig.wrap), opts: []system.Option{system.WithRoomCancelled(func(peer string, _ uint64, _ string) { heard <- peer })}})
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2,
		infos: []system.DecodeInfo{{Peer: "d0", DstPages: []int{0, 1}}, {Peer: "d1", DstPages: []int{0, 1}}}})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	select {
	case <-sig.posted:
	case <-time.After(5 * time.Second):
		t.Fatal("the forward posted nothing")
	}
	first := make(chan error, 1)
	go func() { first <- r.eng.CancelRoom(context.Background(), "d0", 1, "rank 0 gave up") }()
	require.Equal(t, "d0", <-heard, "the first cancel's drop is handed over before its callback")
	require.NoError(t, r.eng.CancelRoom(context.Background(), "d1", 1, "rank 1 gave up"))
	returned := time.Now()
	require.NoError(t, <-first)

	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.landings)
	for _, l := range r.landings {
		assert.False(t, l.At.After(returned), "a write to %s landed %v after the second cancel returned", l.Node, l.At.Sub(returned))
	}
}

// refusing is a transport whose connections to one address fail (a decode
// that refuses them), and whose endpoints say when a batch was posted.
type refusing struct {
	rdma.Transport
	refuse string
	posted chan struct{}
}

func (t refusing) Connect(a []byte) (rdma.Endpoint, error) {
	if string(a) == t.refuse {
		return nil, errors.Mark(errors.Newf("connect to %s: refused", a), rdma.ErrEndpointBroken)
	}
	ep, err := t.Transport.Connect(a)
	if err != nil {
		return nil, err
	}
	return postSignalEndpoint{Endpoint: ep, s: postSignal{posted: t.posted}}, nil
}

// TestPeerLostReachesRetiredEndpoints: a submitter that restarts (here: a
// connection to another decode refused) retires its endpoints, to be
// closed once their batches landed. PeerLost closed only the endpoints of
// the current submitters, so a batch in flight to the lost peer on a
// retired endpoint held its chunk until its completion deadline or its
// finish timeout, although a crashed decode is exactly when restarts and
// PeerLost come together. PeerLost closes the retired endpoints to the
// peer too: the chunk fails at once.
func TestPeerLostReachesRetiredEndpoints(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	posted := make(chan struct{}, 1)
	wrap := func(tr rdma.Transport) rdma.Transport {
		return refusing{Transport: tr, refuse: "decode1", posted: posted}
	}
	// The link holds every batch for ten minutes: only an endpoint's close
	// ends one within the test.
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, decodes: 2, submitters: 1, timeout: 10 * time.Minute,
		link: loopback.Options{Latency: 10 * time.Minute}, wrap: wrap})
	r.register(chunk{room: 1, end: 8, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	finished := make(chan error, 1)
	go func() {
		_, err := r.eng.Finish(context.Background(), 1)
		finished <- err
	}()
	select {
	case <-posted:
	case <-time.After(time.Minute):
		t.Fatal("the Finish posted nothing")
	}
	// The one submitter, with a batch in flight to d0, fails to connect to
	// d1 and restarts: its endpoint to d0 is retired.
	r.register(chunk{room: 2, end: 8, src: []int{2, 3}, total: 2, infos: oneInfo("d1", []int{0, 1})})
	_, err := r.eng.Finish(context.Background(), 2)
	require.Error(t, err)
	require.Eventually(t, func() bool { return r.eng.Restarts() > 0 }, time.Minute, time.Millisecond, "the submitter did not restart")

	require.NoError(t, r.eng.PeerLost("d0", errors.New("heartbeats stopped")))
	select {
	case err := <-finished:
		require.Error(t, err)
		assert.True(t, errors.Is(err, system.ErrPeerLost), "%v", err)
	case <-time.After(time.Minute): // its completion deadline is 2.5 minutes away, the link would hold it for ten
		t.Fatal("the chunk waited for its batch to the lost peer on a retired endpoint")
	}
}

// TestSecondDropHonoursItsOwnTimeout: a room dropped once (a first cancel,
// the default timeout) whose chunk's batch the link holds, then dropped
// again with a short ctx deadline, is answered within the second Drop's
// own bound (its timer tears the chunk down): the chunk ignored the second
// Drop, which waited for the first one's timer, past its own timeout and
// the engine's grace ("did not answer Drop within ...").
func TestSecondDropHonoursItsOwnTimeout(t *testing.T) {
	g := testbed.MLA(4, 16, 64)
	sig := postSignal{posted: make(chan struct{}, 1)}
	heard := make(chan string, 2)
	r := newRig(t, rigOpts{geom: g, hooks: 4, group: 2, timeout: 30 * time.Second, link: loopback.Options{Latency: 10 * time.Minute},
		wrap: wrapping(sig.wrap), opts: []system.Option{system.WithRoomCancelled(func(peer string, _ uint64, _ string) { heard <- peer })}})
	r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
	r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
	select {
	case <-sig.posted:
	case <-time.After(time.Minute):
		t.Fatal("the forward posted nothing")
	}
	first := make(chan error, 1)
	go func() { first <- r.eng.CancelRoom(context.Background(), "d0", 1, "first") }()
	require.Equal(t, "d0", <-heard)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := r.eng.Drop(ctx, 1)
	// End the first drop: close the endpoint holding the batch.
	require.NoError(t, r.eng.PeerLost("d0", errors.New("probe ends the held batch")))
	<-first
	// Its timer tore the chunk down: nothing of it can land any more, the
	// answer a Drop gives when it quiesced (not the engine's "did not
	// answer Drop within ..." past its timeout and grace).
	require.NoError(t, err, "the second Drop, answered within its own timeout")
}
