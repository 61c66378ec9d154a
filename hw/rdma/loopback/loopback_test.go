package loopback

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/rdmatest"
	"github.com/kvstream/kvstream/hw/rdma/tally"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pairOf(opts Options) func(t *testing.T) (rdma.Transport, rdma.Transport) {
	return func(t *testing.T) (rdma.Transport, rdma.Transport) {
		fab := NewFabric(opts)
		a, err := fab.NewTransport("prefill")
		require.NoError(t, err)
		b, err := fab.NewTransport("decode")
		require.NoError(t, err)
		return a, b
	}
}

func TestContract(t *testing.T) {
	rdmatest.Run(t, rdmatest.Factory{
		Pair:     pairOf(Options{}),
		SlowPair: pairOf(Options{Latency: 50 * time.Millisecond}),
	})
}

type fixture struct {
	src, dst *hostmem.Block
	ep       rdma.Endpoint
	lk       rdma.LocalKey
	rk       rdma.RemoteKey
}

func newFixture(t *testing.T, opts Options, n int) fixture {
	from, to := pairOf(opts)(t)
	t.Cleanup(func() { _ = from.Close(); _ = to.Close() })
	return fixtureOn(t, from, to, n)
}

// fixtureOn registers n bytes on each side and connects from to to.
func fixtureOn(t testing.TB, from, to rdma.Transport, n int) fixture {
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

func (f fixture) post(t *testing.T, off, n uint64) <-chan error {
	ch := make(chan error, 1)
	require.NoError(t, f.ep.Post([]rdma.Write{{Src: f.src.Addr + off, Dst: f.dst.Addr + off, Len: n, Local: f.lk, Remote: f.rk}}, func(err error) { ch <- err }))
	return ch
}

// spanRecorder returns an OnBatch hook and the spans it has recorded so far.
func spanRecorder() (func(BatchSpan), func() []BatchSpan) {
	var mu sync.Mutex
	var spans []BatchSpan
	return func(s BatchSpan) { mu.Lock(); spans = append(spans, s); mu.Unlock() },
		func() []BatchSpan { mu.Lock(); defer mu.Unlock(); return append([]BatchSpan(nil), spans...) }
}

func TestModeledBandwidthAndByteScale(t *testing.T) {
	// 1 MiB at 1 GB/s with 64x byte scale is 64 MiB modeled: 67.108864 ms;
	// at time scale 4 that is 16.777216 ms of wall time.
	onBatch, spans := spanRecorder()
	f := newFixture(t, Options{Bandwidth: 1e9, ByteScale: 64, TimeScale: 4, OnBatch: onBatch}, 1<<20)
	start := time.Now()
	require.NoError(t, <-f.post(t, 0, 1<<20))
	elapsed := time.Since(start)
	assert.GreaterOrEqual(t, elapsed, 16*time.Millisecond)
	// The batch's modeled span proves both scales; how long after its
	// instant a starved process gets to run the completion is the
	// machine's business, so the wall time has no ceiling here.
	got := spans()
	require.Len(t, got, 1)
	assert.InDelta(t, float64(16777216*time.Nanosecond), float64(got[0].Due.Sub(got[0].Posted)), float64(time.Microsecond),
		"64 MiB modeled at 1 GB/s, time scale 4")
	assert.False(t, got[0].Landed.Before(got[0].Due), "completed before its modeled instant")
}

func TestSourcesAreReadAtPost(t *testing.T) {
	for name, opts := range map[string]Options{"modeled": {Latency: 20 * time.Millisecond}, "unmodeled": {}} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, opts, 4096)
			copy(f.src.Bytes, bytes.Repeat([]byte{1}, 4096))
			done := f.post(t, 0, 4096)
			copy(f.src.Bytes, bytes.Repeat([]byte{2}, 4096)) // written after the post
			if opts.Latency > 0 {
				assert.Equal(t, make([]byte, 4096), f.dst.Bytes, "nothing lands before the modeled time")
			}
			require.NoError(t, <-done)
			assert.Equal(t, bytes.Repeat([]byte{1}, 4096), f.dst.Bytes, "the sources were read when the batch was posted")
		})
	}
}

// heldCopy returns options whose OnLand holds the first landing, that is a
// copy under way, until release is closed; inCopy is closed once it holds.
func heldCopy(base Options) (opts Options, inCopy, release chan struct{}) {
	inCopy, release = make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	base.OnLand = func(Landing) {
		if !first.Swap(true) {
			close(inCopy)
			<-release
		}
	}
	return base, inCopy, release
}

// twoWrites is a batch whose second write is copied after the first landed.
func (f fixture) twoWrites() []rdma.Write {
	return []rdma.Write{
		{Src: f.src.Addr, Dst: f.dst.Addr, Len: 8, Local: f.lk, Remote: f.rk},
		{Src: f.src.Addr + 8, Dst: f.dst.Addr + 8, Len: 8, Local: f.lk, Remote: f.rk},
	}
}

// stillRunning fails the test if done is closed within a short while: a
// barrier returned while a copy was held. A slow machine can only make the
// check pass wrongly, never fail wrongly.
func stillRunning(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
		t.Errorf("%s returned while a copy was under way", what)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestCloseIsABarrier holds a copy under way (in Post on an unmodeled link,
// on the link goroutine on a modeled one) and checks that neither Close nor
// a second, concurrent Close returns before it is over.
func TestCloseIsABarrier(t *testing.T) {
	for name, base := range map[string]Options{"unmodeled": {}, "modeled": {Latency: 50 * time.Millisecond}} {
		t.Run(name, func(t *testing.T) {
			opts, inCopy, release := heldCopy(base)
			f := newFixture(t, opts, 4096)
			copy(f.src.Bytes, "both writes land") // 16 bytes: the batch's two writes
			go func() { _ = f.ep.Post(f.twoWrites(), func(error) {}) }()
			<-inCopy
			first, second := make(chan struct{}), make(chan struct{})
			go func() { _ = f.ep.Close(); close(first) }()
			require.Eventually(t, f.ep.(*Endpoint).down.Load, 5*time.Second, 100*time.Microsecond, "the first Close never marked the endpoint")
			go func() { _ = f.ep.Close(); close(second) }()
			stillRunning(t, first, "Close")
			stillRunning(t, second, "a second Close")
			close(release)
			<-first
			<-second
			assert.Equal(t, "both writes land", string(f.dst.Bytes[:16]), "the copy under way completed before Close returned")
		})
	}
}

// TestPeerCloseWaitsForCopy: once the receiving node's Transport.Close
// returned, no write lands in its memory any more (its owner may free it).
func TestPeerCloseWaitsForCopy(t *testing.T) {
	for name, base := range map[string]Options{"unmodeled": {}, "modeled": {Latency: 50 * time.Millisecond}} {
		t.Run(name, func(t *testing.T) {
			opts, inCopy, release := heldCopy(base)
			fab := NewFabric(opts)
			from, err := fab.NewTransport("prefill")
			require.NoError(t, err)
			to, err := fab.NewTransport("decode")
			require.NoError(t, err)
			t.Cleanup(func() { _ = from.Close() })
			f := fixtureOn(t, from, to, 4096)
			go func() { _ = f.ep.Post(f.twoWrites(), func(error) {}) }()
			<-inCopy
			closed := make(chan struct{})
			go func() { _ = to.Close(); close(closed) }()
			stillRunning(t, closed, "the peer's Transport.Close")
			close(release)
			<-closed
		})
	}
}

// TestLaterPostWins: on an unmodeled link, a batch posted while another
// poster's batch moves the link's clock must not take the modeled path and
// land after a later batch of its own poster to the same destination.
func TestLaterPostWins(t *testing.T) {
	aInFaults, cPosted := make(chan struct{}), make(chan struct{})
	var aStamp time.Time
	opts := Options{Slow: func(b BatchInfo) Slowdown {
		if b.Seq == 2 { // A, held between its validation and its stamp
			aStamp = time.Now()
			close(aInFaults)
			<-cPosted
		}
		return Slowdown{}
	}}
	f := newFixture(t, opts, 8192)
	w := func(off uint64) []rdma.Write {
		return []rdma.Write{{Src: f.src.Addr + off, Dst: f.dst.Addr + off, Len: 8, Local: f.lk, Remote: f.rk}}
	}
	// Z's completion holds the link goroutine, so that nothing queued lands
	// until B is done.
	zIn, zRelease := make(chan struct{}), make(chan struct{})
	require.NoError(t, f.ep.Post(w(4096), func(error) { close(zIn); <-zRelease }))
	<-zIn
	f.src.Bytes[0] = 'A'
	aDone, aPosted := make(chan error, 1), make(chan error, 1)
	go func() { aPosted <- f.ep.Post(w(0), func(err error) { aDone <- err }) }()
	<-aInFaults
	for !time.Now().After(aStamp) { // C's stamp must be later than A's could be
	}
	cDone := make(chan error, 1)
	require.NoError(t, f.ep.Post(w(4096), func(err error) { cDone <- err }))
	close(cPosted)
	require.NoError(t, <-aPosted)
	f.src.Bytes[0] = 'B'
	bDone := make(chan error, 1)
	require.NoError(t, f.ep.Post(w(0), func(err error) { bDone <- err }))
	close(zRelease)
	require.NoError(t, <-aDone)
	require.NoError(t, <-bDone)
	require.NoError(t, <-cDone)
	assert.Equal(t, byte('B'), f.dst.Bytes[0], "the later write must win")
}

// TestConcurrentPostsAllComplete posts from several goroutines at once, so
// that batches reach the link out of their landing order: every one must
// complete, exactly once, without the endpoint being closed.
func TestConcurrentPostsAllComplete(t *testing.T) {
	const posters, per, size = 4, 2000, 512
	// Delayed batches sit at the head while later ones are inserted in
	// front of them.
	delayOdd := func(b BatchInfo) Slowdown {
		if b.Seq%2 == 1 {
			return Slowdown{Extra: time.Duration(b.Seq%7) * 20 * time.Microsecond}
		}
		return Slowdown{}
	}
	for name, opts := range map[string]Options{"unmodeled": {}, "modeled": {Bandwidth: 1e12}, "delayed": {Slow: delayOdd}} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, opts, posters*size)
			var completed atomic.Int64
			var twice atomic.Bool
			var wg sync.WaitGroup
			for p := range posters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					off := uint64(p * size)
					for range per {
						var once atomic.Bool
						err := f.ep.Post([]rdma.Write{{Src: f.src.Addr + off, Dst: f.dst.Addr + off, Len: size, Local: f.lk, Remote: f.rk}}, func(err error) {
							assert.NoError(t, err)
							if once.Swap(true) {
								twice.Store(true)
							}
							completed.Add(1)
						})
						if !assert.NoError(t, err) {
							return
						}
					}
				}()
			}
			wg.Wait()
			require.Eventually(t, func() bool { return completed.Load() == posters*per }, 10*time.Second, time.Millisecond,
				"batches completed: %d of %d", completed.Load(), posters*per)
			assert.False(t, twice.Load(), "a batch completed twice")
		})
	}
}

// TestPostRacesClose posts from several goroutines while the endpoint is
// closed: every Post either fails as broken, with no completion, or has its
// completion run exactly once, and nothing lands after Close returned.
func TestPostRacesClose(t *testing.T) {
	const posters, size = 4, 4096
	for round := range 50 {
		f := newFixture(t, Options{}, posters*size)
		var wg sync.WaitGroup
		var completions, accepted sync.Map
		start := make(chan struct{})
		for p := range posters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				off := uint64(p * size)
				for i := 0; ; i++ {
					f.src.Bytes[off] = byte(i) // a later landing would change the destination
					key := [2]int{p, i}
					err := f.ep.Post([]rdma.Write{{Src: f.src.Addr + off, Dst: f.dst.Addr + off, Len: size, Local: f.lk, Remote: f.rk}}, func(err error) {
						n, _ := completions.LoadOrStore(key, new(atomic.Int32))
						n.(*atomic.Int32).Add(1)
					})
					if err != nil {
						assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "round %d: post failed unmarked: %v", round, err)
						return
					}
					accepted.Store(key, true)
				}
			}()
		}
		close(start)
		time.Sleep(time.Duration(round%5) * 100 * time.Microsecond)
		require.NoError(t, f.ep.Close())
		closedAt := append([]byte(nil), f.dst.Bytes...)
		wg.Wait()
		require.Eventually(t, func() bool {
			all := true
			accepted.Range(func(k, _ any) bool {
				_, ok := completions.Load(k)
				all = all && ok
				return all
			})
			return all
		}, 5*time.Second, time.Millisecond, "round %d: an accepted batch never completed", round)
		completions.Range(func(k, n any) bool {
			_, ok := accepted.Load(k)
			assert.True(t, ok, "round %d: batch %v completed but its post failed", round, k)
			assert.Equal(t, int32(1), n.(*atomic.Int32).Load(), "round %d: batch %v completed more than once", round, k)
			return true
		})
		assert.Equal(t, closedAt, f.dst.Bytes, "round %d: bytes landed after Close returned", round)
	}
}

// TestSlowLink: a batch that holds the link delays the batch behind it;
// one that only lands later does not.
func TestSlowLink(t *testing.T) {
	for name, tc := range map[string]struct {
		slow    Slowdown
		delayed bool
	}{"hold": {Slowdown{Hold: 100 * time.Millisecond}, true}, "extra": {Slowdown{Extra: 100 * time.Millisecond}, false}} {
		t.Run(name, func(t *testing.T) {
			onBatch, spans := spanRecorder()
			f := newFixture(t, Options{OnBatch: onBatch, Slow: func(b BatchInfo) Slowdown {
				if b.Seq == 1 {
					return tc.slow
				}
				return Slowdown{}
			}}, 4096)
			start := time.Now()
			first := f.post(t, 0, 8)
			require.NoError(t, <-f.post(t, 8, 8))
			second := time.Since(start)
			require.NoError(t, <-first)
			assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "the slowed batch")
			// Whether the second batch waited is its modeled instant's
			// business: its wall time to completion also holds whatever
			// time a starved process took to run it.
			got := spans()
			require.Len(t, got, 2)
			if got[0].Seq != 1 {
				got[0], got[1] = got[1], got[0]
			}
			if tc.delayed {
				assert.GreaterOrEqual(t, second, 100*time.Millisecond, "the batch behind a held link waits for it")
				assert.False(t, got[1].Due.Before(got[0].Posted.Add(100*time.Millisecond)), "the batch behind a held link is due after it")
			} else {
				assert.Zero(t, got[1].Due.Sub(got[1].Posted), "a batch that only lands later holds up nothing: due at its post")
			}
		})
	}
}

func TestRegisterRejectsForeignMemory(t *testing.T) {
	from, to := pairOf(Options{})(t)
	defer from.Close()
	defer to.Close()
	_, err := from.Register(0x1000, 64)
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrInvalidWrite))
	_, err = from.Register(0x1000, 0)
	require.ErrorContains(t, err, "zero length")
}

// TestDeviceSources: memory that is not hostmem registers as device memory
// when the fabric can read it, and writes from it land the device's bytes.
func TestDeviceSources(t *testing.T) {
	const devBase, n = 0x7f00_0000_0000, 4096
	device := make([]byte, n)
	for i := range device {
		device[i] = byte(i * 3)
	}
	reads := 0
	fab := NewFabric(Options{ReadDevice: func(dst []byte, src uint64) error {
		reads++
		if src < devBase || src-devBase+uint64(len(dst)) > n {
			return errors.New("fake device: address out of range")
		}
		copy(dst, device[src-devBase:])
		return nil
	}})
	a, err := fab.NewTransport("gpu-host")
	require.NoError(t, err)
	b, err := fab.NewTransport("decode")
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	src, err := a.Register(devBase, n)
	require.NoError(t, err, "non-hostmem memory registers as device memory")
	dst, err := hostmem.Alloc(n)
	require.NoError(t, err)
	defer dst.Free()
	dr, err := b.Register(dst.Addr, n)
	require.NoError(t, err)
	ep, err := a.Connect(b.Address())
	require.NoError(t, err)
	rk, err := ep.Import(dr.Desc())
	require.NoError(t, err)
	done := make(chan error, 1)
	require.NoError(t, ep.Post([]rdma.Write{{Src: devBase + 100, Dst: dst.Addr, Len: 1000, Local: src.Key(), Remote: rk}}, func(err error) { done <- err }))
	require.NoError(t, <-done)
	assert.Equal(t, device[100:1100], dst.Bytes[:1000])
	assert.Equal(t, 1, reads)

	// Device memory is a source only.
	ep2, err := b.Connect(a.Address())
	require.NoError(t, err)
	rk2, err := ep2.Import(src.Desc())
	require.NoError(t, err)
	err = ep2.Post([]rdma.Write{{Src: dst.Addr, Dst: devBase, Len: 8, Local: dr.Key(), Remote: rk2}}, func(error) {})
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrInvalidWrite))
}

// BenchmarkPost is the bench command's loop on an unmodeled link: one write
// per batch, up to 64 batches in flight. Compare with BenchmarkMemcpy.
func BenchmarkPost(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		b.Run(byteLabel(size), func(b *testing.B) {
			fab := NewFabric(Options{})
			from, err := fab.NewTransport("prefill")
			require.NoError(b, err)
			to, err := fab.NewTransport("decode")
			require.NoError(b, err)
			b.Cleanup(func() { _ = from.Close(); _ = to.Close() })
			f := fixtureOn(b, from, to, size)
			const window = 64
			// Counted, not sent on a channel: the channel's lock would be
			// the benchmark's cost, not the transport's (package tally).
			done := tally.New()
			cb := done.Done
			ws := []rdma.Write{{Src: f.src.Addr, Dst: f.dst.Addr, Len: uint64(size), Local: f.lk, Remote: f.rk}}
			ctx := context.Background()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range int64(b.N) {
				if i-done.Count() >= window {
					if err := done.Wait(ctx, i-window+1); err != nil {
						b.Fatal(err)
					}
				}
				if err := f.ep.Post(ws, cb); err != nil {
					b.Fatal(err)
				}
			}
			if err := done.Wait(ctx, int64(b.N)); err != nil {
				b.Fatal(err)
			}
			if err := done.Err(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkMemcpy is the baseline of BenchmarkPost.
func BenchmarkMemcpy(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		b.Run(byteLabel(size), func(b *testing.B) {
			src, dst := make([]byte, size), make([]byte, size)
			b.SetBytes(int64(size))
			for range b.N {
				copy(dst, src)
			}
		})
	}
}

func byteLabel(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + "MiB"
	}
	return strconv.Itoa(n>>10) + "KiB"
}

// TestCompletesAtModeledInstant: the emulator's copy is done ahead of the
// batch's modeled landing instant, on the link goroutine (staged) or in Post
// when there is no time to spare, and the batch completes at that instant,
// never before; the copy's own time is reported apart.
func TestCompletesAtModeledInstant(t *testing.T) {
	for name, tc := range map[string]struct {
		latency time.Duration
		inPost  bool
	}{"staged": {60 * time.Millisecond, false}, "copied in Post": {time.Millisecond, true}} {
		t.Run(name, func(t *testing.T) {
			const n = 1 << 20
			var mu sync.Mutex
			var spans []BatchSpan
			var landed []Landing
			f := newFixture(t, Options{Latency: tc.latency,
				OnLand:  func(l Landing) { mu.Lock(); landed = append(landed, l); mu.Unlock() },
				OnBatch: func(s BatchSpan) { mu.Lock(); spans = append(spans, s); mu.Unlock() },
			}, n)
			for i := range f.src.Bytes {
				f.src.Bytes[i] = byte(i*5 + 1)
			}
			done := f.post(t, 0, n)
			mu.Lock()
			copiedInPost := len(landed) == 1
			mu.Unlock()
			assert.Equal(t, tc.inPost, copiedInPost, "where the copy ran")
			require.NoError(t, <-done)
			completed := time.Now()
			assert.Equal(t, f.src.Bytes, f.dst.Bytes)
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, spans, 1)
			require.Len(t, landed, 1)
			s := spans[0]
			assert.Equal(t, s.Posted.Add(tc.latency), s.Due, "the modeled instant")
			assert.False(t, s.Landed.Before(s.Due), "completed %v before its modeled instant", s.Due.Sub(s.Landed))
			assert.False(t, completed.Before(s.Due), "done ran before the modeled instant")
			assert.Positive(t, s.Copy, "the copy is timed")
			assert.False(t, landed[0].At.After(s.Landed), "the bytes landed before the batch completed")
		})
	}
}

// TestLaterPostWinsOverStagedCopy: a batch whose copy could not wait (so
// Post would copy it at once) must not land before an earlier batch of the
// same poster still staged for the link to copy: the later write wins.
func TestLaterPostWinsOverStagedCopy(t *testing.T) {
	const big = 32 << 20 // its copy's lead (2 x 1 ns per byte until a copy is measured) exceeds the latency
	f := newFixture(t, Options{Latency: 50 * time.Millisecond}, big)
	f.src.Bytes[0] = 'A'
	first := f.post(t, 0, 4096) // staged: copied just ahead of its instant
	f.src.Bytes[0] = 'B'
	second := f.post(t, 0, big)
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	assert.Equal(t, byte('B'), f.dst.Bytes[0], "the later write must win")
}

// TestRevokeIsABarrier holds a copy under way through an access point and
// checks that Revoke, and a second concurrent Revoke, return only once it
// is over; after the peer's Transport.Close the access point's name is
// gone from the fabric, and no node can take it while it is open.
func TestRevokeIsABarrier(t *testing.T) {
	for name, base := range map[string]Options{"unmodeled": {}, "modeled": {Latency: 50 * time.Millisecond}} {
		t.Run(name, func(t *testing.T) {
			opts, inCopy, release := heldCopy(base)
			fab := NewFabric(opts)
			from, err := fab.NewTransport("prefill")
			require.NoError(t, err)
			to, err := fab.NewTransport("decode")
			require.NoError(t, err)
			t.Cleanup(func() { _ = from.Close(); _ = to.Close() })
			acc, err := to.OpenPeerAccess()
			require.NoError(t, err)
			_, err = fab.NewTransport(string(acc.Address()))
			require.Error(t, err, "a node cannot take an access point's name")

			src, err := hostmem.Alloc(4096)
			require.NoError(t, err)
			dst, err := hostmem.Alloc(4096)
			require.NoError(t, err)
			t.Cleanup(func() { _ = src.Free(); _ = dst.Free() })
			sr, err := from.Register(src.Addr, 4096)
			require.NoError(t, err)
			dr, err := to.Register(dst.Addr, 4096)
			require.NoError(t, err)
			ep, err := from.Connect(acc.Address())
			require.NoError(t, err)
			rk, err := ep.Import(dr.Desc())
			require.NoError(t, err)
			f := fixture{src: src, dst: dst, ep: ep, lk: sr.Key(), rk: rk}
			copy(f.src.Bytes, "both writes land")
			failed := make(chan error, 1)
			go func() { _ = f.ep.Post(f.twoWrites(), func(err error) { failed <- err }) }()
			<-inCopy
			first, second := make(chan struct{}), make(chan struct{})
			go func() { assert.NoError(t, acc.Revoke()); close(first) }()
			require.Eventually(t, f.ep.(*Endpoint).down.Load, 5*time.Second, 100*time.Microsecond, "Revoke never closed the endpoint")
			go func() { assert.NoError(t, acc.Revoke()); close(second) }()
			stillRunning(t, first, "Revoke")
			stillRunning(t, second, "a second Revoke")
			close(release)
			<-first
			<-second
			assert.Equal(t, "both writes land", string(f.dst.Bytes[:16]), "the copy under way completed before Revoke returned")
			if name == "modeled" { // landed, but not yet reported: Revoke failed it
				err := <-failed
				assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
				assert.True(t, errors.Is(err, rdma.ErrRevoked), "a revocation is not to be re-sent: %v", err)
				assert.Contains(t, err.Error(), "revoked")
			}
			err = f.ep.Post(f.twoWrites(), func(error) { t.Error("done after a refused post") })
			assert.True(t, errors.Is(err, rdma.ErrRevoked), "a post after the revocation: %v", err)

			acc2, err := to.OpenPeerAccess()
			require.NoError(t, err)
			require.NoError(t, to.Close())
			_, err = from.Connect(acc2.Address())
			require.Error(t, err, "the peer closed: its access points are gone")
			require.NoError(t, acc2.Revoke(), "revoking after the transport closed")
			_, err = to.OpenPeerAccess()
			assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
		})
	}
}

// TestCloseFailsQueuedCompletions: on the direct path (unmodeled, no hooks)
// the bytes land in Post and the completion waits for the link goroutine;
// a Close while the link goroutine is busy (here: stalled in a done) fails
// those completions itself, once each, before it returns.
func TestCloseFailsQueuedCompletions(t *testing.T) {
	f := newFixture(t, Options{}, 4096)
	copy(f.src.Bytes, "queued")
	stalled, release := make(chan struct{}), make(chan struct{})
	require.NoError(t, f.ep.Post([]rdma.Write{{Src: f.src.Addr, Dst: f.dst.Addr, Len: 1, Local: f.lk, Remote: f.rk}}, func(err error) {
		close(stalled)
		<-release
	}))
	<-stalled
	results := make(chan error, 8)
	for i := range 4 {
		require.NoError(t, f.ep.Post([]rdma.Write{{Src: f.src.Addr, Dst: f.dst.Addr + uint64(8*i), Len: 6, Local: f.lk, Remote: f.rk}}, func(err error) { results <- err }))
	}
	assert.Equal(t, "queued", string(f.dst.Bytes[24:30]), "the bytes landed in Post")
	require.NoError(t, f.ep.Close())
	require.Len(t, results, 4, "Close reported the queued completions before returning")
	for range 4 {
		err := <-results
		require.Error(t, err)
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	}
	close(release)
	err := f.ep.Post([]rdma.Write{{Src: f.src.Addr, Dst: f.dst.Addr, Len: 1, Local: f.lk, Remote: f.rk}}, func(error) { t.Error("done after a refused post") })
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	select {
	case err := <-results:
		t.Fatalf("a completion reported twice: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestLinkTimeHoldsWhatOverflows: a batch whose time on the link is beyond
// time.Duration's range (4 KiB at 1e-15 Gb/s: 1e9 years) is held at the
// longest time the link models, and lands that far in the future; the
// conversion once wrapped it into a negative time, so the batch landed at
// once and a run reported 0.46 ms of transfer. Within the range, LinkTime
// is the modeled bytes over the rate, and that over the time scale.
func TestLinkTimeHoldsWhatOverflows(t *testing.T) {
	modeled, wall, ok := Options{Bandwidth: 1e9, ByteScale: 3, TimeScale: 2}.LinkTime(1e9)
	require.True(t, ok)
	require.Equal(t, 3*time.Second, modeled)
	require.Equal(t, 1500*time.Millisecond, wall)

	opts := Options{Bandwidth: 1e-15 * 1e9 / 8, ByteScale: 1, TimeScale: 1}
	modeled, wall, ok = opts.LinkTime(4096)
	require.False(t, ok)
	require.Equal(t, MaxModeled, modeled)
	require.Equal(t, MaxModeled, wall)
	var l link
	l.init(&opts)
	b := &batch{info: BatchInfo{Bytes: 4096}}
	require.False(t, l.schedule(b, Slowdown{}), "a batch of 1e9 years does not land at once")
	require.Equal(t, MaxModeled+opts.Latency, b.landAt.Sub(b.posted), "held at the longest time")

	// A slowdown on top of a held time holds too.
	b = &batch{info: BatchInfo{Bytes: 4096}}
	l.busyUntil = time.Time{}
	require.False(t, l.schedule(b, Slowdown{Hold: time.Second}))
	require.True(t, b.landAt.After(b.posted))
}
