package actors

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// serveCtx is the actor context serve sees: it records what is sent.
type serveCtx struct {
	actor.Context
	self *actor.PID
	sent []any
}

func (c *serveCtx) Self() *actor.PID         { return c.self }
func (c *serveCtx) Send(_ *actor.PID, m any) { c.sent = append(c.sent, m) }
func (c *serveCtx) countResumes() (n int)    { return countType[*resume](c.sent) }
func (c *serveCtx) countAnswers() (n int)    { return countType[*messages.Submitted](c.sent) }
func countType[T any](ms []any) (n int) {
	for _, m := range ms {
		if _, ok := m.(T); ok {
			n++
		}
	}
	return n
}

// acceptingEndpoint takes every batch and never completes one.
type acceptingEndpoint struct {
	posts  atomic.Int64
	closed atomic.Bool
}

func (e *acceptingEndpoint) Import(rdma.RegionDesc) (rdma.RemoteKey, error) { return 1, nil }
func (e *acceptingEndpoint) Post([]rdma.Write, func(error)) error {
	e.posts.Add(1)
	return nil
}
func (e *acceptingEndpoint) Close() error { e.closed.Store(true); return nil }

// serveRig is a submitter connected to peer "p", and ready Works toward it.
func serveRig(t *testing.T) (*submitter, *acceptingEndpoint, func(err error) *readyWork) {
	l, err := plan.NewLayout([]plan.Buffer{{Name: "KV0", Base: 1 << 20, ItemLen: 64, Pages: 8, Layer: 0}}, []rdma.LocalKey{1}, 1, 1, 16, cp.CP{Size: 1})
	require.NoError(t, err)
	ep := &acceptingEndpoint{}
	peers, rec := NewPeers(), &plan.Peer{ID: "p"}
	require.NoError(t, peers.Add(rec))
	s := &submitter{
		env:      &Env{System: actor.NewActorSystem(), Log: zap.NewNop(), Layout: l, Peers: peers, Observer: quietObserver{}},
		ready:    newReadyHub(true),
		resuming: &atomic.Bool{},
		conns:    map[string]*conn{"p": {peer: "p", rec: rec, ep: ep, keys: []rdma.RemoteKey{1}, bases: []uint64{0}}},
	}
	job := NewJob(&plan.Plan{Chunk: messages.Chunk{Serial: 1}, Dests: []plan.Dest{{Peer: "p"}}})
	n := 0
	work := func(err error) *readyWork {
		n++
		return &readyWork{w: &Work{Work: messages.Work{Seq: n, Event: messages.Passed}, Job: job}, id: uint64(n),
			wt: waited{start: time.Now(), end: time.Now(), err: err}}
	}
	return s, ep, work
}

// A Work whose service restarts the submitter (here: a lost device) is
// answered, the Works taken after it go back to the queue, and, since the
// resume being served is lost with the panic, the submitter asks itself for
// another one: a Work still queued, taken by no resume, would otherwise wait
// for a wake-up that may never come. The failing Work is the last of the
// take: nothing is put back, and only the resume can reach the queue.
func TestServeFailureAsksForAnotherResume(t *testing.T) {
	s, ep, work := serveRig(t)
	lost := errors.Mark(errors.New("context lost"), cuda.ErrDeviceLost)
	take := make([]*readyWork, 0, ServeLimit)
	for i := 0; i < ServeLimit-1; i++ {
		take = append(take, work(nil))
	}
	take = append(take, work(lost))
	stranded := work(nil)
	s.ready.requeue([]*readyWork{{w: stranded.w, id: stranded.id, wake: func() {}}})
	ctx := &serveCtx{self: actor.NewPID("local", "submitter")}

	require.PanicsWithValue(t, deviceFailure{err: errors.Mark(errors.Mark(lost, ErrEventWait), cuda.ErrDeviceLost)}.Error(), func() {
		defer func() {
			if r := recover(); r != nil {
				panic(r.(error).Error())
			}
		}()
		s.serve(ctx, take)
	})
	assert.Equal(t, ServeLimit, ctx.countAnswers(), "every Work taken is answered")
	assert.Equal(t, int64(ServeLimit-1), ep.posts.Load())
	assert.Equal(t, 1, ctx.countResumes(), "a resume for the Works still queued")
	assert.True(t, s.resuming.Load())
	assert.Equal(t, 1, s.ready.q.Len(), "the queued Work is still there for it")
}

// connectingTransport connects to anything, on an endpoint that accepts
// every batch.
type connectingTransport struct {
	rdma.Transport
	ep *acceptingEndpoint
}

func (t connectingTransport) Connect([]byte) (rdma.Endpoint, error) { return t.ep, nil }

// A Work whose destination has no connection yet is served alone: the
// Works taken after it go back to the queue for the other submitters,
// rather than waiting for its connect (which may block: a first use, a
// restarted submitter).
func TestServeConnectsAlone(t *testing.T) {
	s, ep, work := serveRig(t)
	fresh := &acceptingEndpoint{}
	s.env.Transport = connectingTransport{ep: fresh}
	require.NoError(t, s.env.Peers.Add(&plan.Peer{ID: "q"}))
	first := work(nil)
	first.w.Job = NewJob(&plan.Plan{Chunk: messages.Chunk{Serial: 2}, Dests: []plan.Dest{{Peer: "q"}}})
	var woken atomic.Int32
	rest := []*readyWork{work(nil), work(nil), work(nil)}
	for _, rw := range rest {
		rw.wake = func() { woken.Add(1) }
	}
	ctx := &serveCtx{self: actor.NewPID("local", "submitter")}
	s.serve(ctx, append([]*readyWork{first}, rest...))
	assert.Equal(t, 1, ctx.countAnswers(), "only the Work that connects was served")
	assert.Equal(t, int64(1), fresh.posts.Load())
	assert.Zero(t, ep.posts.Load())
	assert.Equal(t, 3, s.ready.q.Len(), "the others went back to the queue")
	assert.Equal(t, int32(3), woken.Load(), "and their submitters were woken")
}

// A batch written off (its completion lost) gives its bytes in flight back
// once, whether its completion then comes or not.
func TestWrittenOffBatchGivesItsBytesBackOnce(t *testing.T) {
	var inFlight atomic.Int64
	ep := &acceptingEndpoint{}
	job := NewJob(&plan.Plan{Dests: []plan.Dest{{Peer: "p"}}})
	held := &heldBytes{n: 4096, in: &inFlight}
	inFlight.Add(held.n)
	var done func(error)
	posted, err := job.post(3, 0, capturing{ep, &done}, nil, held, func(error) { held.release() })
	require.NoError(t, err)
	require.True(t, posted)
	require.Equal(t, int64(4096), inFlight.Load())

	job.writeOff(3, 0)
	assert.Zero(t, inFlight.Load(), "written off: its bytes are no longer in flight")
	done(nil) // the completion comes after all
	assert.Zero(t, inFlight.Load(), "and gives nothing back twice")
	job.writeOff(3, 0)
	assert.Zero(t, inFlight.Load())
}

// capturing is an endpoint that keeps the done of the batch posted on it.
type capturing struct {
	*acceptingEndpoint
	done *func(error)
}

func (c capturing) Post(ws []rdma.Write, done func(error)) error {
	*c.done = done
	return c.acceptingEndpoint.Post(ws, done)
}

// A PeerLost closes only the endpoints made for the record lost: a
// submitter that hears of it late, having connected to the peer added
// again under its id since (a decode server that restarted), keeps that
// endpoint, while it closes the lost record's (current or retired).
func TestPeerLostClosesOnlyTheLostRecordsEndpoints(t *testing.T) {
	lostRec, newRec := &plan.Peer{ID: "p"}, &plan.Peer{ID: "p"}
	retiredEP, currentEP := &acceptingEndpoint{}, &acceptingEndpoint{}
	s := &submitter{retired: &retiredConns{}, conns: map[string]*conn{}}
	old := &conn{peer: "p", rec: lostRec, ep: retiredEP}
	old.inflight.Add(1) // a batch still in flight: retired, not closed yet
	old.retire(s.retired)
	s.conns["p"] = &conn{peer: "p", rec: newRec, ep: currentEP}

	s.peerLost(&messages.PeerLost{Peer: "p", Record: lostRec})
	assert.True(t, retiredEP.closed.Load(), "the lost record's endpoint is closed")
	assert.False(t, currentEP.closed.Load(), "the new record's endpoint is kept")
	require.Contains(t, s.conns, "p")

	s.peerLost(&messages.PeerLost{Peer: "p", Record: newRec})
	assert.True(t, currentEP.closed.Load(), "a loss of the new record closes its endpoint")
	assert.NotContains(t, s.conns, "p")
}
