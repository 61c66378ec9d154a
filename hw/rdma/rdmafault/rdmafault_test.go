package rdmafault_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/hw/rdma/rdmatest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pairOf wraps the sending side of a loopback pair.
func pairOf(opts loopback.Options, decide func(rdmafault.BatchInfo) rdmafault.Fault) func(t *testing.T) (rdma.Transport, rdma.Transport) {
	return func(t *testing.T) (rdma.Transport, rdma.Transport) {
		fab := loopback.NewFabric(opts)
		a, err := fab.NewTransport("prefill")
		require.NoError(t, err)
		b, err := fab.NewTransport("decode")
		require.NoError(t, err)
		return rdmafault.Wrap(a, decide), b
	}
}

func never(rdmafault.BatchInfo) rdmafault.Fault { return rdmafault.Fault{} }

// delayAll holds every completion for a millisecond, so that the contract
// runs through the wrapper's own bookkeeping rather than past it.
func delayAll(rdmafault.BatchInfo) rdmafault.Fault {
	return rdmafault.Fault{Kind: rdmafault.DelayCompletion, Delay: time.Millisecond}
}

func TestContract(t *testing.T) {
	for name, decide := range map[string]func(rdmafault.BatchInfo) rdmafault.Fault{"none": never, "delayed": delayAll} {
		t.Run(name, func(t *testing.T) {
			rdmatest.Run(t, rdmatest.Factory{
				Pair:     pairOf(loopback.Options{}, decide),
				SlowPair: pairOf(loopback.Options{Latency: 50 * time.Millisecond}, decide),
			})
		})
	}
}

type fixture struct {
	src, dst *hostmem.Block
	ep       rdma.Endpoint
	lk       rdma.LocalKey
	rk       rdma.RemoteKey
}

func newFixture(t *testing.T, from, to rdma.Transport, n int) fixture {
	t.Cleanup(func() { _ = from.Close(); _ = to.Close() })
	src, err := hostmem.Alloc(n)
	require.NoError(t, err)
	dst, err := hostmem.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Free(); _ = dst.Free() })
	sr, err := from.Register(src.Addr, uint64(n))
	require.NoError(t, err)
	dr, err := to.Register(dst.Addr, uint64(n))
	require.NoError(t, err)
	ep, err := from.Connect(to.Address())
	require.NoError(t, err)
	rk, err := ep.Import(dr.Desc())
	require.NoError(t, err)
	return fixture{src: src, dst: dst, ep: ep, lk: sr.Key(), rk: rk}
}

func (f fixture) write(off, n uint64) []rdma.Write {
	return []rdma.Write{{Src: f.src.Addr + off, Dst: f.dst.Addr + off, Len: n, Local: f.lk, Remote: f.rk}}
}

func (f fixture) post(t *testing.T, off, n uint64) <-chan error {
	ch := make(chan error, 1)
	require.NoError(t, f.ep.Post(f.write(off, n), func(err error) { ch <- err }))
	return ch
}

func TestInjectedFaults(t *testing.T) {
	kinds := map[uint64]rdmafault.Kind{1: rdmafault.PostError, 2: rdmafault.FailCompletion, 3: rdmafault.LoseCompletion, 4: rdmafault.DelayCompletion}
	var mu sync.Mutex
	var landed []loopback.Landing
	var infos []rdmafault.BatchInfo
	from, to := pairOf(loopback.Options{OnLand: func(l loopback.Landing) { mu.Lock(); landed = append(landed, l); mu.Unlock() }},
		func(b rdmafault.BatchInfo) rdmafault.Fault {
			mu.Lock()
			infos = append(infos, b)
			mu.Unlock()
			return rdmafault.Fault{Kind: kinds[b.Seq], Delay: 30 * time.Millisecond}
		})(t)
	f := newFixture(t, from, to, 4096)
	for i := range f.src.Bytes {
		f.src.Bytes[i] = 9
	}

	err := f.ep.Post(f.write(0, 8), func(error) { t.Error("done after a failed post") })
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdmafault.ErrInjected))

	err = <-f.post(t, 0, 8)
	require.Error(t, err, "failed completion")
	assert.True(t, errors.Is(err, rdmafault.ErrInjected))
	assert.Equal(t, byte(0), f.dst.Bytes[0], "a failed batch lands nothing")

	lost := f.post(t, 8, 8)
	start := time.Now()
	require.NoError(t, <-f.post(t, 16, 8), "delayed completion still succeeds")
	assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	select {
	case <-lost:
		t.Fatal("a lost completion must not be reported")
	default:
	}
	assert.Equal(t, byte(9), f.dst.Bytes[8], "the lost-completion batch landed")
	require.NoError(t, f.ep.Close())
	err = <-lost
	require.Error(t, err, "teardown reports the lost batch as failed")
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken))
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, landed, 2, "the lost and the delayed batch landed")
	require.Len(t, infos, 4)
	assert.Equal(t, rdmafault.BatchInfo{From: "prefill", To: "decode", Seq: 3, Bytes: 8, Writes: 1, Dst: f.dst.Addr + 8, DstOffset: 8}, infos[2])
}

func TestPeerGoneBreaksEndpoint(t *testing.T) {
	from, to := pairOf(loopback.Options{}, func(b rdmafault.BatchInfo) rdmafault.Fault {
		if b.Seq == 2 {
			return rdmafault.Fault{Kind: rdmafault.PeerGone}
		}
		return rdmafault.Fault{}
	})(t)
	f := newFixture(t, from, to, 4096)
	require.NoError(t, <-f.post(t, 0, 8))
	err := <-f.post(t, 0, 8)
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken))
	err = f.ep.Post(f.write(0, 8), func(error) { t.Error("done after a refused post") })
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken))
}

// TestBreakEndpointTearsTheBatch: a connection broken in the middle of a
// batch lands its first half only, fails the batch as a broken endpoint
// and refuses later batches; a fresh endpoint to the same peer works.
func TestBreakEndpointTearsTheBatch(t *testing.T) {
	from, to := pairOf(loopback.Options{}, func(b rdmafault.BatchInfo) rdmafault.Fault {
		if b.Seq == 1 {
			return rdmafault.Fault{Kind: rdmafault.BreakEndpoint}
		}
		return rdmafault.Fault{}
	})(t)
	f := newFixture(t, from, to, 4096)
	copy(f.src.Bytes[:16], "0123456789abcdef")
	ws := append(f.write(0, 8), f.write(8, 8)...)
	done := make(chan error, 1)
	require.NoError(t, f.ep.Post(ws, func(err error) { done <- err }))
	err := <-done
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	assert.Equal(t, "01234567", string(f.dst.Bytes[:8]), "the first half landed")
	assert.Equal(t, make([]byte, 8), f.dst.Bytes[8:16], "the second half never did")
	err = f.ep.Post(f.write(8, 8), func(error) { t.Error("done after a refused post") })
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken))
	require.NoError(t, f.ep.Close(), "the broken endpoint closes quiesced")
	ep, err := from.Connect(to.Address())
	require.NoError(t, err, "the peer is still there")
	require.NoError(t, ep.Close())
}

// TestCloseFailsHeldBatchesOnce: a delayed completion whose endpoint closes
// before the delay ran out is failed by Close, once, and the timer that
// would have reported it later does not run it again.
func TestCloseFailsHeldBatchesOnce(t *testing.T) {
	from, to := pairOf(loopback.Options{}, func(rdmafault.BatchInfo) rdmafault.Fault {
		return rdmafault.Fault{Kind: rdmafault.DelayCompletion, Delay: 20 * time.Millisecond}
	})(t)
	f := newFixture(t, from, to, 4096)
	var calls atomic.Int32
	done := make(chan error, 2)
	require.NoError(t, f.ep.Post(f.write(0, 8), func(err error) { calls.Add(1); done <- err }))
	require.NoError(t, f.ep.Close())
	err := <-done
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	select {
	case err := <-done:
		t.Fatalf("done ran a second time: %v", err)
	case <-time.After(60 * time.Millisecond): // past the delay
	}
	assert.Equal(t, int32(1), calls.Load())
}

// TestTransportCloseClosesEndpoints: closing the wrapped transport fails
// the lost completions of its endpoints.
func TestTransportCloseClosesEndpoints(t *testing.T) {
	from, to := pairOf(loopback.Options{}, func(rdmafault.BatchInfo) rdmafault.Fault {
		return rdmafault.Fault{Kind: rdmafault.LoseCompletion}
	})(t)
	f := newFixture(t, from, to, 4096)
	lost := f.post(t, 0, 8)
	require.NoError(t, from.Close())
	err := <-lost
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	_, err = from.Connect(to.Address())
	require.Error(t, err, "a closed transport connects nothing")
}

// TestNotQuiescedReachesHeldBatches: when the transport's Close cannot
// quiesce, a held batch the transport had not completed carries the mark.
func TestNotQuiescedReachesHeldBatches(t *testing.T) {
	fab := loopback.NewFabric(loopback.Options{Latency: time.Hour})
	a, err := fab.NewTransport("prefill")
	require.NoError(t, err)
	b, err := fab.NewTransport("decode")
	require.NoError(t, err)
	from := rdmafault.Wrap(unquiesced{a}, func(rdmafault.BatchInfo) rdmafault.Fault {
		return rdmafault.Fault{Kind: rdmafault.LoseCompletion}
	})
	f := newFixture(t, from, b, 4096)
	lost := f.post(t, 0, 8)
	require.True(t, errors.Is(f.ep.Close(), rdma.ErrNotQuiesced))
	err = <-lost
	assert.True(t, errors.Is(err, rdma.ErrNotQuiesced), "%v", err)
}

// unquiesced is a transport whose endpoints' Close reports that writes may
// still land and whose Close fails nothing itself: the batch stays with its
// transport.
type unquiesced struct{ rdma.Transport }

func (u unquiesced) Connect(addr []byte) (rdma.Endpoint, error) {
	ep, err := u.Transport.Connect(addr)
	if err != nil {
		return nil, err
	}
	return unquiescedEndpoint{ep}, nil
}

type unquiescedEndpoint struct{ rdma.Endpoint }

func (unquiescedEndpoint) Close() error {
	return errors.Mark(errors.New("drain timed out"), rdma.ErrNotQuiesced)
}

// TestPeerAccessPassesThrough: wrapped on the target side, the wrapper's
// access points are the loopback's (the contract's PeerAccess checks run
// through it), and a wrapped transport without them says so, marked.
func TestPeerAccessPassesThrough(t *testing.T) {
	rdmatest.Run(t, rdmatest.Factory{Pair: func(t *testing.T) (rdma.Transport, rdma.Transport) {
		from, to := pairOf(loopback.Options{}, delayAll)(t)
		return from, rdmafault.Wrap(to, never)
	}})

	fab := loopback.NewFabric(loopback.Options{})
	lb, err := fab.NewTransport("decode")
	require.NoError(t, err)
	defer lb.Close()
	_, err = rdmafault.Wrap(unquiesced{lb}, never).OpenPeerAccess()
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrUnsupported), "%v", err)
}

// TestBreakEndpointKeepsInnerQuiescence: the half of a broken batch that
// went through the transport may report that its writes may still land
// (a broken UCX connection); the broken batch says so too (and whether a
// later landing fences them), so that it is not re-sent as if quiet. A
// half that landed adds nothing.
func TestBreakEndpointKeepsInnerQuiescence(t *testing.T) {
	for name, c := range map[string]struct {
		inner               error
		notQuiesced, fenced bool
	}{
		"landed":       {},
		"not quiesced": {inner: errors.Mark(errors.New("connection reset"), rdma.ErrNotQuiesced), notQuiesced: true},
		"fenced": {inner: errors.Mark(errors.Mark(errors.New("connection reset"), rdma.ErrNotQuiesced), rdma.ErrFenced),
			notQuiesced: true, fenced: true},
	} {
		t.Run(name, func(t *testing.T) {
			fab := loopback.NewFabric(loopback.Options{})
			a, err := fab.NewTransport("prefill")
			require.NoError(t, err)
			b, err := fab.NewTransport("decode")
			require.NoError(t, err)
			from := rdmafault.Wrap(completesWith{a, c.inner}, func(rdmafault.BatchInfo) rdmafault.Fault {
				return rdmafault.Fault{Kind: rdmafault.BreakEndpoint}
			})
			f := newFixture(t, from, b, 4096)
			ch := make(chan error, 1)
			// Two writes: the first half (one) goes through the transport.
			require.NoError(t, f.ep.Post(append(f.write(0, 8), f.write(8, 8)...), func(err error) { ch <- err }))
			err = <-ch
			require.Error(t, err)
			assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
			assert.Equal(t, c.notQuiesced, errors.Is(err, rdma.ErrNotQuiesced), "%v", err)
			assert.Equal(t, c.fenced, errors.Is(err, rdma.ErrFenced), "%v", err)
			_ = f.ep.Close()
		})
	}
}

// completesWith is a transport whose batches land, then complete with err
// (nil: as the transport reported them).
type completesWith struct {
	rdma.Transport
	err error
}

func (c completesWith) Connect(addr []byte) (rdma.Endpoint, error) {
	ep, err := c.Transport.Connect(addr)
	if err != nil {
		return nil, err
	}
	return completesWithEndpoint{ep, c.err}, nil
}

type completesWithEndpoint struct {
	rdma.Endpoint
	err error
}

func (e completesWithEndpoint) Post(ws []rdma.Write, done func(error)) error {
	return e.Endpoint.Post(ws, func(err error) {
		if err == nil {
			err = e.err
		}
		done(err)
	})
}

// TestBatchInfoNamesTheOffset: a decision sees the first write's offset
// within the region it writes and that region's index on the endpoint,
// which stay the same wherever the peer's memory is mapped.
func TestBatchInfoNamesTheOffset(t *testing.T) {
	var mu sync.Mutex
	var seen []rdmafault.BatchInfo
	from, to := pairOf(loopback.Options{}, func(b rdmafault.BatchInfo) rdmafault.Fault {
		mu.Lock()
		seen = append(seen, b)
		mu.Unlock()
		return rdmafault.Fault{}
	})(t)
	f := newFixture(t, from, to, 4096)
	require.NoError(t, <-f.post(t, 64, 8))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 1)
	assert.Equal(t, f.dst.Addr+64, seen[0].Dst)
	assert.Equal(t, uint64(64), seen[0].DstOffset)
	assert.Equal(t, 0, seen[0].DstRegion)
}
