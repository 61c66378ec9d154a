package system

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// stallingTransport's endpoints lose every completion and do not return
// from Close until release is closed: a UCX endpoint draining toward a
// stalled peer (its close may take CloseDrain plus CloseTimeout, longer
// than finishGrace).
type stallingTransport struct {
	rdma.Transport
	posted  chan struct{} // closed at the first Post
	once    sync.Once
	release chan struct{}
	freed   sync.Once
}

// free lets the endpoints' closes return.
func (t *stallingTransport) free() { t.freed.Do(func() { close(t.release) }) }

func (t *stallingTransport) Connect(addr []byte) (rdma.Endpoint, error) {
	ep, err := t.Transport.Connect(addr)
	if err != nil {
		return nil, err
	}
	return &stallingEndpoint{Endpoint: ep, t: t}, nil
}

type stallingEndpoint struct {
	rdma.Endpoint
	t     *stallingTransport
	mu    sync.Mutex
	dones []func(error)
}

// Post keeps done and posts nothing: the completion is lost until Close.
func (e *stallingEndpoint) Post(_ []rdma.Write, done func(error)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dones = append(e.dones, done)
	e.t.once.Do(func() { close(e.t.posted) })
	return nil
}

func (e *stallingEndpoint) Close() error {
	<-e.t.release
	e.mu.Lock()
	dones := e.dones
	e.dones = nil
	e.mu.Unlock()
	for _, d := range dones {
		d(errors.Mark(errors.New("torn down"), rdma.ErrEndpointBroken))
	}
	return e.Endpoint.Close()
}

// stallingEngine is an engine whose chunk's teardown stalls in its
// endpoint's Close, with a finish timeout of 200 ms and a grace of 100 ms,
// and a chunk of room 1 whose forward ended and which posted a batch (its
// completion lost). release lets the teardown end.
func stallingEngine(t *testing.T) (e *Engine, release func()) {
	t.Helper()
	p := newEnginePools(t)
	tr := &stallingTransport{Transport: p.pre, posted: make(chan struct{}), release: make(chan struct{})}
	release = tr.free
	e, err := New(Config{Buffers: p.buffers, HookLayers: 3, PageSize: 4, FinishTimeout: 200 * time.Millisecond},
		WithTransport(tr), withSimulated(), WithLogger(zap.NewNop()), WithGetenv(func(string) string { return "" }))
	require.NoError(t, err)
	e.grace = 100 * time.Millisecond
	t.Cleanup(func() { release(); _ = e.Close() })
	require.NoError(t, e.AddPeer(p.peer))
	_, err = e.Register(context.Background(), goodSpec())
	require.NoError(t, err)
	f, err := e.BeginForward()
	require.NoError(t, err)
	for l := range 3 {
		require.NoError(t, f.LayerEnd(l))
	}
	require.NoError(t, f.End())
	<-tr.posted // a batch is in flight: a teardown must close its endpoint
	return e, release
}

// A Finish whose chunk's teardown outlasts the finish timeout and the
// grace returns then, FAILED (not the zero Status, which is SUCCESS) and
// with an error that says its writes may still land: a caller that builds
// its notice from the result must not tell the decode its pages are done.
func TestFinishThatGivesUpFailsNotQuiesced(t *testing.T) {
	e, release := stallingEngine(t)
	res, err := e.Finish(context.Background(), 1)
	require.Error(t, err)
	assert.Equal(t, Failed, res.Status)
	assert.Equal(t, err, res.Err)
	assert.True(t, errors.Is(err, ErrNotQuiesced), "%v", err)
	assert.True(t, errors.Is(err, ErrTimeout), "%v", err)
	assert.Contains(t, err.Error(), "room 1")
	release() // the teardown ends: Close then finds nothing left
	require.NoError(t, e.Close())
}

// A Drop that gives up while the room's teardown still runs says the
// room's writes may still land (Close, which drops every room, keeps such
// an error).
func TestDropThatGivesUpIsNotQuiesced(t *testing.T) {
	e, release := stallingEngine(t)
	err := e.Drop(context.Background(), 1)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNotQuiesced), "%v", err)
	assert.True(t, errors.Is(err, ErrTimeout), "%v", err)
	release()
	require.NoError(t, e.Close())
}

// Finish after Close fails, and says so in its Status too.
func TestFinishAfterCloseIsFailed(t *testing.T) {
	e := newEngine(t, nil)
	require.NoError(t, e.Close())
	res, err := e.Finish(context.Background(), 1)
	require.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, Failed, res.Status)
}
