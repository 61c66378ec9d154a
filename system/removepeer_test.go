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

// TestRemovePeerForgetsIt: a prefill that serves ever-new decode sessions
// (each a peer added, sent to, and removed once its rooms are done) keeps
// no record of, and no endpoint to, the ended ones; a peer in use is not
// removed; a removed id may be added again, lost before or not.
func TestRemovePeerForgetsIt(t *testing.T) {
	pools := newEnginePools(t)
	tr := &countingTransport{Transport: pools.pre}
	e, err := New(Config{Buffers: pools.buffers, HookLayers: 3, PageSize: 4},
		WithTransport(tr), withSimulated(), WithLogger(zap.NewNop()), WithGetenv(func(string) string { return "" }))
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	// decode is a decode session: its transport (a process of its own, in
	// production) and its peer record.
	decode := func(id string) Peer {
		dec, err := pools.fab.NewTransport(id + "-" + fmt.Sprint(time.Now().UnixNano()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = dec.Close() })
		p := Peer{ID: id, Address: dec.Address()}
		for _, base := range pools.dst {
			r, err := dec.Register(base, itemLen*pages)
			require.NoError(t, err)
			p.Buffers = append(p.Buffers, PeerBuffer{Region: r.Desc(), ItemLen: itemLen})
		}
		return p
	}
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
