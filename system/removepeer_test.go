package system

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// countingTransport counts the endpoints its Connect opened and those
// closed since.
type countingTransport struct {
	rdma.Transport
	open atomic.Int64
}

func (t *countingTransport) Connect(addr []byte) (rdma.Endpoint, error) {
	ep, err := t.Transport.Connect(addr)
	if err != nil {
		return nil, err
	}
	t.open.Add(1)
	return &countingEndpoint{Endpoint: ep, t: t}, nil
}

type countingEndpoint struct {
	rdma.Endpoint
	t      *countingTransport
	closed atomic.Bool
}

func (e *countingEndpoint) Close() error {
	if !e.closed.Swap(true) {
		e.t.open.Add(-1)
	}
	return e.Endpoint.Close()
}

// session is a decode session's peer under id: a transport of its own on
// the pools' fabric, named name (a process of its own, or its access point,
// in production: another address each time), with the decode pool's
// buffers registered there.
func (p enginePools) session(t *testing.T, id, name string) Peer {
	t.Helper()
	dec, err := p.fab.NewTransport(name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dec.Close() })
	peer := Peer{ID: id, Address: dec.Address()}
	for _, base := range p.dst {
		r, err := dec.Register(base, itemLen*pages)
		require.NoError(t, err)
		peer.Buffers = append(peer.Buffers, PeerBuffer{Region: r.Desc(), ItemLen: itemLen})
	}
	return peer
}

// newCountingEngine is an engine on the pools' fabric, with no peer yet,
// whose transport counts the endpoints open.
func newCountingEngine(t *testing.T) (enginePools, *countingTransport, *Engine) {
	t.Helper()
	pools := newEnginePools(t)
	tr := &countingTransport{Transport: pools.pre}
	e, err := New(Config{Buffers: pools.buffers, HookLayers: 3, PageSize: 4},
		WithTransport(tr), withSimulated(), WithLogger(zap.NewNop()), WithGetenv(func(string) string { return "" }))
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return pools, tr, e
}

// TestRemovePeerForgetsIt: a prefill that serves ever-new decode sessions
// (each a peer added, sent to, and removed once its rooms are done) keeps
// no record of, and no endpoint to, the ended ones; a peer in use is not
// removed; a removed id may be added again, lost before or not.
func TestRemovePeerForgetsIt(t *testing.T) {
	pools, tr, e := newCountingEngine(t)
	var err error
	decode := func(id string) Peer { return pools.session(t, id, id+"-"+fmt.Sprint(time.Now().UnixNano())) }
	spec := func(room uint64, peer string) ChunkSpec {
		s := goodSpec()
		s.Room, s.Infos[0].Peer = room, peer
		return s
	}
	ctx := context.Background()
	send := func(room uint64, peer string) {
		t.Helper()
		_, err := e.Register(ctx, spec(room, peer))
		require.NoError(t, err)
		res, err := e.Finish(ctx, room)
		require.NoError(t, err)
		require.Equal(t, Succeeded, res.Status)
	}
	room := uint64(0)

	// Sessions come and go: nothing of the ended ones stays.
	for i := range 20 {
		id := fmt.Sprintf("decode-%d", i)
		require.NoError(t, e.AddPeer(decode(id)))
		room++
		send(room, id)
		require.NoError(t, e.RemovePeer(id))
		assert.Zero(t, e.env.Peers.Len(), "peer records")
		assert.ErrorIs(t, e.RemovePeer(id), ErrBadInput, "removed already")
		_, err := e.Register(ctx, spec(room+1, id))
		assert.ErrorIs(t, err, ErrBadInput, "a removed peer is unknown")
	}
	require.Eventually(t, func() bool { return tr.open.Load() == 0 }, time.Minute, time.Millisecond,
		"the submitters close their endpoints to removed peers: %d open", tr.open.Load())

	// A peer in use stays.
	require.NoError(t, e.AddPeer(decode("d")))
	room++
	_, err = e.Register(ctx, spec(room, "d"))
	require.NoError(t, err)
	err = e.RemovePeer("d")
	require.ErrorIs(t, err, ErrBadInput)
	assert.ErrorContains(t, err, `remove peer "d": 1 live chunks send to it`)
	assert.Equal(t, 1, e.env.Peers.Len())
	res, err := e.Finish(ctx, room)
	require.NoError(t, err)
	require.Equal(t, Succeeded, res.Status)

	// A decode server that restarted under its id: lost, then removed once
	// its rooms answered, then added again and sent to.
	require.NoError(t, e.PeerLost("d", errors.New("the decode process died")))
	_, err = e.Register(ctx, spec(room+1, "d"))
	require.ErrorIs(t, err, ErrPeerLost, "a lost peer fails what is sent to it while it is known")
	require.NoError(t, e.RemovePeer("d"))
	require.NoError(t, e.AddPeer(decode("d")))
	room++
	send(room, "d")
	require.NoError(t, e.RemovePeer("d"))
	require.Eventually(t, func() bool { return tr.open.Load() == 0 }, time.Minute, time.Millisecond, "%d open", tr.open.Load())
	assert.Zero(t, e.env.Registry.ToPeer("d"))
}

// TestRemovePeerForgetsItsCancelledRooms: the rooms a decode session
// cancelled go with its peer: a decode server restarted under the same id
// is another session, and its room of the same id another request.
func TestRemovePeerForgetsItsCancelledRooms(t *testing.T) {
	e := newEngine(t, nil)
	ctx := context.Background()
	rec, ok := e.env.Peers.Get("d")
	require.True(t, ok)
	require.NoError(t, e.CancelRoom(ctx, "d", 1, "the old session gave it up"))
	_, err := e.Register(ctx, goodSpec())
	require.ErrorIs(t, err, ErrRoomCancelled, "refused while the session lives")
	require.NoError(t, e.RemovePeer("d"))
	require.NoError(t, e.AddPeer(*rec))  // the restarted decode, same id
	_, err = e.Register(ctx, goodSpec()) // room 1 toward the new session
	require.NoError(t, err, "the old session's cancel does not refuse the new session's room")
}

// TestRemovePeerWhenIdle: a decode session that ends before its rooms there
// did (decode.Client's Close on an error path) leaves no peer behind: the
// removal waits for the peer's last live chunk, finished or dropped, and
// has happened when that chunk's Finish or Drop returns; meanwhile no new
// chunk is sent to the peer. A peer idle already goes at once. The removal
// is bound to the pool it was asked for: a later session's peer added
// under the same id stays.
func TestRemovePeerWhenIdle(t *testing.T) {
	pools, tr, e := newCountingEngine(t)
	var err error
	// session is a decode session under id "d", another address each time.
	sessions := 0
	session := func() Peer {
		sessions++
		return pools.session(t, "d", fmt.Sprintf("d-session-%d", sessions))
	}
	spec := func(room uint64) ChunkSpec {
		s := goodSpec()
		s.Room = room
		return s
	}
	ctx := context.Background()
	held := func() bool { _, ok := e.env.Peers.Get("d"); return ok }

	p := session()
	require.NoError(t, e.RemovePeerWhenIdle(p), "a peer not held: nothing of its session is left")
	require.NoError(t, e.AddPeer(p))
	require.NoError(t, e.RemovePeerWhenIdle(p), "idle: removed at once")
	require.False(t, held())

	for _, end := range []string{"finish", "drop"} {
		p := session()
		require.NoError(t, e.AddPeer(p), end)
		_, err = e.Register(ctx, spec(1))
		require.NoError(t, err)
		_, err = e.Register(ctx, spec(2))
		require.NoError(t, err)
		require.NoError(t, e.RemovePeerWhenIdle(p), "%s: a peer in use is marked, not refused", end)
		require.NoError(t, e.RemovePeerWhenIdle(p), "a second call changes nothing")
		require.True(t, held(), "%s: kept while 2 chunks send to it", end)

		_, err = e.Register(ctx, spec(3))
		require.ErrorIs(t, err, ErrPeerLost, "%s: no new chunk toward a peer being removed", end)
		assert.ErrorContains(t, err, `register room 3: decode peer "d" is being removed (its session ended): nothing registered`)
		assert.ErrorIs(t, e.RemovePeer("d"), ErrBadInput, "RemovePeer still refuses a peer in use")

		if end == "finish" {
			res, err := e.Finish(ctx, 1)
			require.NoError(t, err)
			require.Equal(t, Succeeded, res.Status)
			require.True(t, held(), "kept while room 2's chunk sends to it")
			res, err = e.Finish(ctx, 2)
			require.NoError(t, err)
			require.Equal(t, Succeeded, res.Status)
		} else {
			require.NoError(t, e.Drop(ctx, 1))
			require.True(t, held(), "kept while room 2's chunk sends to it")
			require.NoError(t, e.Drop(ctx, 2))
		}
		require.False(t, held(), "%s: removed when the last chunk's answer returned", end)
		assert.Zero(t, e.env.Registry.ToPeer("d"))
		e.cancels.mu.RLock()
		assert.Empty(t, e.removing, "no removal left pending")
		e.cancels.mu.RUnlock()
		require.Eventually(t, func() bool { return tr.open.Load() == 0 }, time.Minute, time.Millisecond,
			"%s: the submitters close their endpoints to the removed peer: %d open", end, tr.open.Load())
	}

	// A late call for an ended session, after its peer was removed and a
	// later session added under the same id, idle or busy: the later
	// session's peer stays, unmarked, and is sent to.
	old := session()
	require.NoError(t, e.AddPeer(old))
	require.NoError(t, e.RemovePeer("d"))
	later := session()
	require.NoError(t, e.AddPeer(later))
	require.NoError(t, e.RemovePeerWhenIdle(old), "idle")
	require.True(t, held(), "the later session's peer stays")
	_, err = e.Register(ctx, spec(4))
	require.NoError(t, err)
	require.NoError(t, e.RemovePeerWhenIdle(old), "busy")
	e.cancels.mu.RLock()
	assert.Empty(t, e.removing, "the later session's peer is not marked")
	e.cancels.mu.RUnlock()
	_, err = e.Register(ctx, spec(5))
	require.NoError(t, err, "the later session takes new rooms")
	for _, room := range []uint64{4, 5} {
		res, err := e.Finish(ctx, room)
		require.NoError(t, err)
		require.Equal(t, Succeeded, res.Status)
	}
	require.True(t, held(), "the later session's peer stays after its rooms")
	require.NoError(t, e.RemovePeerWhenIdle(later))
	require.False(t, held())
}
