package scalebench

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/rdma"
)

// nullTransport accepts every batch and completes it on its own goroutine,
// moving no byte; it counts batches and writes.
type nullTransport struct {
	done    chan func()
	stopped chan struct{}
	once    sync.Once
	keys    atomic.Uint32
	batches atomic.Int64
	writes  atomic.Int64
}

var _ rdma.Transport = (*nullTransport)(nil)

// completions is the depth of the completion queue; a Post that finds it
// full completes the batch on a fresh goroutine, never inside Post.
const completions = 1 << 16

func newNullTransport() *nullTransport {
	t := &nullTransport{done: make(chan func(), completions), stopped: make(chan struct{})}
	go func() {
		defer close(t.stopped)
		for fn := range t.done {
			fn()
		}
	}()
	return t
}

func (t *nullTransport) Name() string    { return "null" }
func (t *nullTransport) Address() []byte { return []byte("null") }

func (t *nullTransport) Register(addr, length uint64) (rdma.Region, error) {
	k := t.keys.Add(1)
	return nullRegion{desc: rdma.RegionDesc{Addr: addr, Len: length, Key: []byte{byte(k)}}, key: rdma.LocalKey(k)}, nil
}

func (t *nullTransport) Connect([]byte) (rdma.Endpoint, error) { return nullEndpoint{t: t}, nil }

func (t *nullTransport) Close() error {
	t.once.Do(func() { close(t.done) })
	<-t.stopped
	return nil
}

type nullRegion struct {
	desc rdma.RegionDesc
	key  rdma.LocalKey
}

func (r nullRegion) Desc() rdma.RegionDesc { return r.desc }
func (r nullRegion) Key() rdma.LocalKey    { return r.key }
func (r nullRegion) Deregister() error     { return nil }

type nullEndpoint struct{ t *nullTransport }

func (e nullEndpoint) Import(rdma.RegionDesc) (rdma.RemoteKey, error) { return 1, nil }

func (e nullEndpoint) Post(ws []rdma.Write, done func(error)) error {
	if len(ws) == 0 {
		return errors.Mark(errors.New("null transport: empty batch"), rdma.ErrInvalidWrite)
	}
	e.t.batches.Add(1)
	e.t.writes.Add(int64(len(ws)))
	fn := func() { done(nil) }
	select {
	case e.t.done <- fn:
	default:
		go fn()
	}
	return nil
}

func (e nullEndpoint) Close() error { return nil }

// doneStream records events that are complete at once: the engine's
// figures exclude the device.
type doneStream struct{}

func (doneStream) Record() (cuda.Event, error) { return doneEvent{}, nil }

type doneEvent struct{}

func (doneEvent) Query() (bool, error) { return true, nil }

func (doneEvent) Wait(context.Context) error { return nil }
