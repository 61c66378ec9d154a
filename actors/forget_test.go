package actors

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A peer removed and added again (a decode server that restarted under its
// id) before a submitter heard of the removal: the submitter's endpoint
// and keys are the old record's, and its next post connects afresh.
func TestServeReconnectsToAPeerAddedAgain(t *testing.T) {
	s, old, work := serveRig(t)
	fresh := &acceptingEndpoint{}
	s.env.Transport = connectingTransport{ep: fresh}
	_, err := s.env.Peers.Remove("p")
	require.NoError(t, err)
	require.NoError(t, s.env.Peers.Add(&plan.Peer{ID: "p"}))
	ctx := &serveCtx{self: actor.NewPID("local", "submitter")}
	s.serve(ctx, []*readyWork{work(nil)})
	assert.Zero(t, old.posts.Load(), "nothing on the old record's endpoint")
	assert.Equal(t, int64(1), fresh.posts.Load())
}

// A Work of a chunk that ended (its job's context is done: its gate is
// closed) connects to nothing: its peer may have been removed, and a
// connect to an unknown peer would restart the submitter.
func TestServeOfAnEndedChunkConnectsToNothing(t *testing.T) {
	s, _, work := serveRig(t)
	s.env.Transport = nil // a connect would panic
	_, err := s.env.Peers.Remove("p")
	require.NoError(t, err)
	delete(s.conns, "p")
	rw := work(nil)
	rw.w.Job = NewJob(&plan.Plan{Chunk: messages.Chunk{Serial: 2}, Dests: []plan.Dest{{Peer: "p"}}})
	rw.w.Job.closeGate()
	ctx := &serveCtx{self: actor.NewPID("local", "submitter")}
	require.NotPanics(t, func() { s.serve(ctx, []*readyWork{rw}) })
	require.Equal(t, 1, ctx.countAnswers())
	for _, m := range ctx.sent {
		if a, ok := m.(*messages.Submitted); ok {
			assert.False(t, a.Posted)
			assert.NoError(t, a.Err, "skipped, not failed")
		}
	}
}

// The registry counts the live chunks per decode peer from their hand-off
// to their end, and forgets a chunk the manager did not spawn.
func TestRegistryCountsChunksPerPeer(t *testing.T) {
	r := NewRegistry()
	a := messages.Chunk{ChunkKey: messages.ChunkKey{Room: 1}, Serial: 1}
	b := messages.Chunk{ChunkKey: messages.ChunkKey{Room: 2}, Serial: 2}
	dup := messages.Chunk{ChunkKey: messages.ChunkKey{Room: 2}, Serial: 3}
	r.Sending(a, []string{"d", "e"})
	r.Sending(b, []string{"d"})
	r.Sending(dup, []string{"d"})
	r.spawned(a, true)
	r.spawned(b, true)
	assert.Equal(t, 3, r.ToPeer("d"))
	r.NotSent(dup)
	assert.Equal(t, 2, r.ToPeer("d"))
	assert.Equal(t, 1, r.ToPeer("e"))
	r.ended(a)
	assert.Equal(t, 1, r.ToPeer("d"))
	assert.Zero(t, r.ToPeer("e"))
	r.ended(b)
	assert.Zero(t, r.ToPeer("d"))
	assert.Empty(t, r.sending)
	assert.Empty(t, r.toPeer)
}

// The ForgetPeer of a removed record reaching a submitter after it already
// connected to the peer added again under its id (a resume queued before
// it served a new chunk) closes only the old record's endpoint.
func TestLateForgetSparesTheNewRecordsEndpoint(t *testing.T) {
	s, _, work := serveRig(t)
	fresh := &acceptingEndpoint{}
	s.env.Transport = connectingTransport{ep: fresh}
	gone, err := s.env.Peers.Remove("p")
	require.NoError(t, err)
	again := &plan.Peer{ID: "p"}
	require.NoError(t, s.env.Peers.Add(again)) // the restarted decode
	ctx := &serveCtx{self: actor.NewPID("local", "submitter")}
	s.serve(ctx, []*readyWork{work(nil)}) // reconnects: the old endpoint is the old record's
	require.Same(t, again, s.conns["p"].rec)
	s.Receive(&messageCtx{serveCtx: ctx, msg: &forgetPeer{peer: "p", rec: gone}}) // the old record's ForgetPeer arrives
	c, ok := s.conns["p"]
	require.True(t, ok, "the new session's endpoint is kept")
	assert.Same(t, again, c.rec)
	assert.False(t, fresh.closed.Load(), "its endpoint is not closed")
	s.Receive(&messageCtx{serveCtx: ctx, msg: &forgetPeer{peer: "p", rec: again}})
	_, ok = s.conns["p"]
	assert.False(t, ok, "the forget of its own record closes it")
}
