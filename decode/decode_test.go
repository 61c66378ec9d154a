package decode_test

import (
	"context"
	"errors" // the standard library's: every error of the package answers it
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain checks for leaks, except protoactor's dead-letter throttle: a
// goroutine that a dead letter (a Terminated for a watcher that already
// stopped, as when both ends of a session stop) starts and that ends one
// throttle interval (1 s) later, on its own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		// The same goroutine, as Go 1.27 names it (NewThrottle no longer inlined).
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"))
}

const (
	itemLen = 64
	pages   = 16
	buffers = 3
)

// rig is a decode server and a prefill client on one node (one node per
// process: see decode.Node), over a private loopback fabric.
type rig struct {
	node *decode.Node
	srv  *decode.Server
	pool *hostmem.Block
	tr   rdma.Transport
}

func newRig(t testing.TB, cfg decode.Config) *rig {
	t.Helper()
	return newRigOn(t, decode.NodeConfig{Listen: "127.0.0.1:0"}, cfg)
}

// newRigOn is newRig on a node of nc.
func newRigOn(t testing.TB, nc decode.NodeConfig, cfg decode.Config) *rig {
	t.Helper()
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(t, err)
	pool, err := hostmem.Alloc(buffers * itemLen * pages)
	require.NoError(t, err)
	node, err := decode.ListenConfig(nc)
	require.NoError(t, err)
	if cfg.Buffers == nil && cfg.Size == nil {
		cfg.Buffers = decodeBuffers(pool)
	}
	cfg.ByeGrace = time.Minute // only the prefill leaving may end a session in these tests
	srv, err := decode.New(node, tr, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		assert.NoError(t, srv.Close(ctx))
		assert.NoError(t, node.Close(ctx))
		_ = tr.Close()
		_ = pool.Free()
	})
	return &rig{node: node, srv: srv, pool: pool, tr: tr}
}

// newServerParts gives what decode.New takes besides its Config, released
// when t ends: a loopback transport, the buffers of a fresh pool, and a
// node on loopback.
func newServerParts(t *testing.T) (*loopback.Transport, []decode.Buffer, *decode.Node) {
	t.Helper()
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	pool, err := hostmem.Alloc(buffers * itemLen * pages)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pool.Free() })
	node, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close(context.Background()) })
	return tr, decodeBuffers(pool), node
}

func decodeBuffers(pool *hostmem.Block) []decode.Buffer {
	out := make([]decode.Buffer, buffers)
	for b := range out {
		out[b] = decode.Buffer{Name: "KV", Base: pool.Addr + uint64(b*itemLen*pages), ItemLen: itemLen, Pages: pages}
	}
	return out
}

// prefillLayout is the prefill side's buffers (only names, layers and item
// lengths cross the wire).
func prefillLayout(item uint64) []system.Buffer {
	return system.MLABuffers(make([]uint64, buffers), item, 8)
}

func (r *rig) dial(t *testing.T) *decode.Client {
	t.Helper()
	c, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// notice is a chunk of room over positions [from, to), to decode pages
// base+position.
func notice(room uint64, from, to, base int, last bool, status system.Status, err error) decode.Notice {
	n := decode.Notice{Last: last, Result: system.Result{Status: status, Err: err}}
	n.Result.Chunk.Room, n.Result.Chunk.Start, n.Result.Chunk.End = room, from*4, to*4
	for p := from; p < to; p++ {
		n.Positions = append(n.Positions, p)
		n.DstPages = append(n.DstPages, base+p)
	}
	return n
}

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRoomCompletesAfterItsLastChunk(t *testing.T) {
	r := newRig(t, decode.Config{})
	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	c := r.dial(t)
	peer := c.Peer()
	assert.Equal(t, "decode", peer.ID)
	assert.Len(t, peer.Buffers, buffers)
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))

	// Not complete before its last chunk: a bounded wait times out.
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := r.srv.Wait(short, 7)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)

	require.NoError(t, c.Notify(waitCtx(t), notice(7, 2, 4, 4, true, system.Succeeded, nil)))
	room, err := r.srv.Wait(waitCtx(t), 7)
	require.NoError(t, err)
	assert.True(t, room.Complete)
	assert.Equal(t, []int{4, 5, 6, 7}, room.Pages)
	require.Len(t, room.Chunks, 2)
	assert.Equal(t, []int{6, 7}, room.Chunks[1].DstPages)
	assert.Equal(t, system.Succeeded, room.Chunks[1].Status)

	ss, err := r.srv.Accept(waitCtx(t))
	require.NoError(t, err)
	assert.Equal(t, "p0", ss.Prefill())
	sum, err := c.Bye(waitCtx(t), nil)
	require.NoError(t, err)
	assert.Equal(t, decode.Summary{Chunks: 2}, sum)
	err = c.Notify(waitCtx(t), notice(7, 0, 1, 4, true, system.Succeeded, nil))
	assert.True(t, errors.Is(err, decode.ErrClosed), "a notice after Bye: %v", err)
	rep, err := ss.Wait(waitCtx(t))
	require.NoError(t, err)
	assert.True(t, rep.Complete)
	assert.Equal(t, 1, rep.Rooms)

	require.NoError(t, r.srv.Release(7))
	_, err = r.srv.Wait(waitCtx(t), 7)
	assert.True(t, errors.Is(err, decode.ErrBadInput), "released: %v", err)
}

func TestFailedChunkFailsTheRoom(t *testing.T) {
	r := newRig(t, decode.Config{})
	require.NoError(t, r.srv.Expect(1, []int{0, 1, 2, 3}))
	require.NoError(t, r.srv.Expect(2, []int{8, 9, 10, 11}))
	c := r.dial(t)
	require.NoError(t, c.Notify(waitCtx(t), notice(1, 0, 2, 0, false, system.Failed, errors.New("timeout"))))
	_, err := r.srv.Wait(waitCtx(t), 1)
	assert.True(t, errors.Is(err, decode.ErrChunkFailed), "%v", err)
	assert.False(t, errors.Is(err, decode.ErrNotQuiesced), "the prefill's Finish quiesced it")
	assert.ErrorContains(t, err, "timeout")

	// A later successful last chunk does not complete a failed room.
	err = c.Notify(waitCtx(t), notice(1, 2, 4, 0, true, system.Succeeded, nil))
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	room, err := r.srv.Wait(waitCtx(t), 1)
	assert.Error(t, err)
	assert.False(t, room.Complete)

	n := notice(2, 0, 4, 8, true, system.Failed, markNotQuiesced(t))
	require.NoError(t, c.Notify(waitCtx(t), n))
	_, err = r.srv.Wait(waitCtx(t), 2)
	assert.True(t, errors.Is(err, decode.ErrChunkFailed), "%v", err)
	assert.True(t, errors.Is(err, decode.ErrNotQuiesced), "its pages must not be reused: %v", err)
}

// markNotQuiesced returns an error marked system.ErrNotQuiesced, as a
// Finish whose teardown could not stop the writes returns.
func markNotQuiesced(t *testing.T) error {
	t.Helper()
	return &marked{msg: "teardown could not drain", mark: system.ErrNotQuiesced}
}

type marked struct {
	msg  string
	mark error
}

func (m *marked) Error() string        { return m.msg }
func (m *marked) Is(target error) bool { return target == m.mark }

// TestAbortedSessionIsNeverComplete: a goodbye after some of the chunks
// fails the rooms it left unfinished, and the session is not complete, as
// the prefill said and as the decode server sees for itself.
func TestAbortedSessionIsNeverComplete(t *testing.T) {
	for _, tc := range []struct {
		name    string
		aborted error
	}{
		{"the prefill says it stopped", errors.New("forward 3: decode lost")},
		{"the prefill says nothing", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, decode.Config{})
			require.NoError(t, r.srv.Expect(1, []int{0, 1, 2, 3}))
			c := r.dial(t)
			ss, err := r.srv.Accept(waitCtx(t))
			require.NoError(t, err)
			require.NoError(t, c.Notify(waitCtx(t), notice(1, 0, 2, 0, false, system.Succeeded, nil)))
			_, err = c.Bye(waitCtx(t), tc.aborted)
			assert.True(t, errors.Is(err, decode.ErrChunkFailed) || errors.Is(err, decode.ErrSessionAborted), "%v", err)

			_, err = r.srv.Wait(waitCtx(t), 1)
			assert.True(t, errors.Is(err, decode.ErrSessionAborted), "%v", err)
			rep, err := ss.Wait(waitCtx(t))
			assert.True(t, errors.Is(err, decode.ErrSessionAborted), "%v", err)
			assert.False(t, rep.Complete)
			assert.Equal(t, 1, rep.Chunks)
		})
	}
}

func TestPrefillLostFailsItsRooms(t *testing.T) {
	r := newRig(t, decode.Config{})
	require.NoError(t, r.srv.Expect(1, []int{0, 1, 2, 3}))
	require.NoError(t, r.srv.Expect(2, []int{4, 5}))
	c := r.dial(t)
	ss, err := r.srv.Accept(waitCtx(t))
	require.NoError(t, err)
	require.NoError(t, c.Notify(waitCtx(t), notice(1, 0, 2, 0, false, system.Succeeded, nil)))
	// The prefill is declared lost (its heartbeats stopped, or an operator
	// cut it off): its rooms fail once its access is revoked.
	require.NoError(t, r.srv.Disconnect("p0", errors.New("evicted")))

	_, err = r.srv.Wait(waitCtx(t), 1)
	assert.True(t, errors.Is(err, decode.ErrPrefillLost), "%v", err)
	_, revocable := r.tr.(rdma.PeerAccessor)
	assert.Equal(t, !revocable, errors.Is(err, decode.ErrNotQuiesced), "quiet only if its access was revoked: %v", err)
	rep, err := ss.Wait(waitCtx(t))
	assert.True(t, errors.Is(err, decode.ErrPrefillLost), "%v", err)
	assert.False(t, rep.Complete)

	// Room 2 had no notice from the lost session: it still waits for one.
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = r.srv.Wait(short, 2)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
}

func TestBadInputNamesTheValueAndChangesNothing(t *testing.T) {
	r := newRig(t, decode.Config{})
	for _, tc := range []struct {
		pages []int
		want  string
	}{
		{[]int{0, 16}, "room 1: page 16 at index 1 is outside the pool of 16 pages"},
		{[]int{-1}, "room 1: page -1 at index 0 is outside the pool of 16 pages"},
		{[]int{3, 4, 3}, "room 1: page 3 at index 2 duplicates index 0"},
		{nil, "room 1: no pages"},
	} {
		err := r.srv.Expect(1, tc.pages)
		assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
		assert.EqualError(t, err, tc.want)
	}
	_, err := r.srv.Wait(waitCtx(t), 1)
	assert.EqualError(t, err, "room 1 is unknown: Expect it first", "nothing was expected")
	assert.True(t, errors.Is(err, decode.ErrBadInput))
	assert.True(t, errors.Is(r.srv.Release(9), decode.ErrBadInput))

	require.NoError(t, r.srv.Expect(1, []int{0, 1}))
	err = r.srv.Expect(1, []int{2, 3})
	assert.EqualError(t, err, "room 1 is already expected: Release it first")
	c := r.dial(t)

	// A notice for a room nobody expected changes nothing.
	err = c.Notify(waitCtx(t), notice(5, 0, 2, 0, true, system.Succeeded, nil))
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "room 5 is unknown to the decode server")
	_, err = r.srv.Wait(waitCtx(t), 5)
	assert.True(t, errors.Is(err, decode.ErrBadInput), "still unknown: %v", err)

	// A notice naming pages outside the pool, or that are not the room's,
	// fails the room: the prefill may have written where the decode did
	// not allocate.
	err = c.Notify(waitCtx(t), notice(1, 0, 2, 15, true, system.Succeeded, nil))
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "room 1 chunk [0, 8): decode page 16 at index 1 is outside the pool of 16 pages")
	_, err = r.srv.Wait(waitCtx(t), 1)
	assert.True(t, errors.Is(err, decode.ErrChunkFailed), "%v", err)
	err = c.Notify(waitCtx(t), decode.Notice{Result: notice(2, 0, 1, 0, true, system.Succeeded, nil).Result, Positions: []int{16}, DstPages: []int{3}})
	assert.ErrorContains(t, err, "position 16 at index 0 is outside the pool's 16 pages")
	err = r.srv.Expect(3, []int{0, 1})
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	assert.EqualError(t, err, "room 3: page at index 0: decode page 0 belongs to room 1", "pages belong to one room at a time")
	require.NoError(t, r.srv.Expect(3, []int{4, 5}))
	err = c.Notify(waitCtx(t), notice(3, 0, 2, 2, true, system.Succeeded, nil))
	assert.ErrorContains(t, err, "room 3 chunk [0, 8): position 0 went to decode page 2, the room's page is 4")
	_, err = r.srv.Wait(waitCtx(t), 3)
	assert.True(t, errors.Is(err, decode.ErrChunkFailed), "%v", err)

	// A prefill whose layout does not match the pool is refused at Dial.
	_, err = decode.Dial(waitCtx(t), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(2 * itemLen), PageSize: 4})
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "prefill buffer 0 (KV0): item length 128, decode buffer 0 (KV): 64")
}

func TestVerifyRejectsTheRoom(t *testing.T) {
	r := newRig(t, decode.Config{Verify: func(_ *decode.Session, c decode.Chunk) error {
		if c.DstPages[0] == 2 {
			return errors.New("page 2: checksum differs")
		}
		return nil
	}})
	require.NoError(t, r.srv.Expect(1, []int{0, 1, 2, 3}))
	c := r.dial(t)
	require.NoError(t, c.Notify(waitCtx(t), notice(1, 0, 2, 0, false, system.Succeeded, nil)))
	err := c.Notify(waitCtx(t), notice(1, 2, 4, 0, true, system.Succeeded, nil))
	assert.True(t, errors.Is(err, decode.ErrChunkFailed), "%v", err)
	_, err = r.srv.Wait(waitCtx(t), 1)
	assert.True(t, errors.Is(err, decode.ErrChunkFailed), "%v", err)
	assert.ErrorContains(t, err, "page 2: checksum differs")
}

func TestSizeFromTheFirstPrefill(t *testing.T) {
	var got []decode.PrefillBuffer
	pool := sizedPool(t)
	r := newRig(t, decode.Config{Size: func(l []decode.PrefillBuffer) ([]decode.Buffer, error) {
		got = l
		return decodeBuffers(pool), nil
	}})
	_, err := r.srv.Peer()
	assert.True(t, errors.Is(err, decode.ErrBadInput), "not sized before the first Hello: %v", err)
	c := r.dial(t)
	require.Len(t, got, buffers)
	assert.Equal(t, decode.PrefillBuffer{Name: "KV1", Layer: 1, ItemLen: itemLen, Pages: 8}, got[1])
	peer, err := r.srv.Peer()
	require.NoError(t, err)
	assert.Equal(t, peer.Buffers, c.Peer().Buffers)
	require.NoError(t, c.Close(context.Background()))
}

// sizedPool is a pool for Config.Size to return, freed after the rig's
// cleanup closed the server (cleanups run last-registered first).
func sizedPool(t *testing.T) *hostmem.Block {
	t.Helper()
	pool, err := hostmem.Alloc(buffers * itemLen * pages)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pool.Free() })
	return pool
}

// A pool that Config.Size returns and that does not match the prefill's
// layout is refused before anything is registered: the next prefill gets
// another chance to size it.
func TestSizeThatDoesNotMatchChangesNothing(t *testing.T) {
	pool := sizedPool(t)
	calls := 0
	r := newRig(t, decode.Config{Size: func([]decode.PrefillBuffer) ([]decode.Buffer, error) {
		calls++
		bufs := decodeBuffers(pool)
		if calls == 1 {
			bufs = bufs[:1]
		}
		return bufs, nil
	}})
	_, err := decode.Dial(waitCtx(t), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4})
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "3 prefill buffers, the decode pool has 1")
	_, err = r.srv.Peer()
	assert.True(t, errors.Is(err, decode.ErrBadInput), "still not sized: %v", err)
	r.dial(t)
	_, err = r.srv.Peer()
	assert.NoError(t, err)
}

// TestRefusedAndDecodeLost: the prefill side's classes, seen by the
// standard library's errors.Is: a session beyond Config.MaxSessions is
// unavailable (retry later), and a decode server that goes away is
// reported lost, to the engine's PeerLost hook and to the next Notify.
func TestRefusedAndDecodeLost(t *testing.T) {
	r := newRig(t, decode.Config{MaxSessions: 1})
	c := r.dial(t)
	_, err := decode.Dial(waitCtx(t), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p1"})
	assert.True(t, errors.Is(err, decode.ErrUnavailable), "%v", err)
	assert.ErrorContains(t, err, "already 1 sessions (Config.MaxSessions)")

	lost := make(chan error, 1)
	c.OnLost(func(err error) { lost <- err })
	require.NoError(t, r.srv.Close(waitCtx(t)))
	select {
	case err := <-lost:
		assert.True(t, errors.Is(err, decode.ErrDecodeLost), "%v", err)
	case <-waitCtx(t).Done():
		t.Fatal("the decode server's stop was not reported")
	}
	err = c.Notify(waitCtx(t), notice(1, 0, 1, 0, true, system.Succeeded, nil))
	assert.True(t, errors.Is(err, decode.ErrDecodeLost), "%v", err)
	assert.True(t, errors.Is(c.Lost(), decode.ErrDecodeLost))
}

// TestPoolOfTransportAllocations: a pool the transport allocated (its
// Buffer.Region set) is offered as is and never deregistered by the
// server: its owner frees it after Close.
func TestPoolOfTransportAllocations(t *testing.T) {
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(t, err)
	defer tr.Close()
	var bufs []decode.Buffer
	var allocs []rdma.Allocation
	for range buffers {
		a, err := tr.Allocate(itemLen * pages)
		require.NoError(t, err)
		allocs = append(allocs, a)
		bufs = append(bufs, decode.Buffer{Name: "KV", Base: a.Desc().Addr, ItemLen: itemLen, Pages: pages, Region: a})
	}
	node, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	defer node.Close(context.Background())
	srv, err := decode.New(node, tr, decode.Config{Buffers: bufs})
	require.NoError(t, err)
	peer, err := srv.Peer()
	require.NoError(t, err)
	for b, pb := range peer.Buffers {
		assert.Equal(t, allocs[b].Desc().Addr, pb.Region.Addr, "the allocation's own registration")
		assert.Equal(t, allocs[b].Desc().Key, pb.Region.Key)
	}
	require.NoError(t, srv.Close(context.Background()))
	for _, a := range allocs {
		clear(a.Bytes()) // still mapped: the server did not free it
		require.NoError(t, a.Free())
	}

	// A region that does not hold the buffer is refused, naming it.
	a, err := tr.Allocate(itemLen)
	require.NoError(t, err)
	defer a.Free()
	_, err = decode.New(node, tr, decode.Config{Buffers: []decode.Buffer{{Name: "KV", Base: a.Desc().Addr, ItemLen: itemLen, Pages: pages, Region: a}}})
	assert.True(t, errors.Is(err, decode.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "does not hold")
}

// A notice a busy server answers after the call timeout: the error says no
// answer came in time (ErrUnreachable), not that the server refused the
// chunk, and the server still acts on the notice: the room completes.
func TestNoticeAnsweredLateIsNotARefusal(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	r := newRig(t, decode.Config{Verify: func(*decode.Session, decode.Chunk) error { <-release; return nil }})
	require.NoError(t, r.srv.Expect(1, []int{0, 1, 2, 3}))
	c, err := decode.Dial(context.Background(), r.node, decode.DialConfig{Decode: r.srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p0",
		CallTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	err = c.Notify(context.Background(), notice(1, 0, 4, 0, true, system.Succeeded, nil))
	require.Error(t, err, "the server's Verify holds the answer past the call timeout")
	assert.True(t, errors.Is(err, decode.ErrUnreachable), "%v", err)
	assert.False(t, errors.Is(err, decode.ErrRefused), "%v", err)
	assert.False(t, errors.Is(err, decode.ErrChunkFailed), "%v", err)
	free()
	_, err = r.srv.Wait(waitCtx(t), 1)
	assert.NoError(t, err, "the server acted on the notice it answered late")
}
