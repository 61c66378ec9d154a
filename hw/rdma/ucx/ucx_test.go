//go:build ucx

package ucx

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/rdmatest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// tcpMaxPollAtStart is UCX_TCP_MAX_POLL in the C environment before any
// test made a Transport.
var tcpMaxPollAtStart string

func TestMain(m *testing.M) {
	tcpMaxPollAtStart = cGetenv("UCX_TCP_MAX_POLL")
	if os.Getenv(peerEnv) != "" {
		os.Exit(runPeer())
	}
	if os.Getenv(revokePeerEnv) != "" {
		os.Exit(runRevokePeer())
	}
	if os.Getenv(setupPeerEnv) != "" {
		os.Exit(runSetupPeer())
	}
	goleak.VerifyTestMain(m)
}

// fabrics are the UCX_TLS settings every test runs under: by default TCP
// through the loopback interface and shared memory. KVSTREAM_UCX_TLS
// replaces them with ';'-separated UCX_TLS values, e.g. "rc,self" on a host
// with an RDMA NIC.
var fabrics = func() []struct{ name, tls string } {
	if env := os.Getenv("KVSTREAM_UCX_TLS"); env != "" {
		var fs []struct{ name, tls string }
		for _, tls := range strings.Split(env, ";") {
			fs = append(fs, struct{ name, tls string }{strings.ReplaceAll(tls, ",", "+"), tls})
		}
		return fs
	}
	return []struct{ name, tls string }{{"tcp", "tcp"}, {"shm", "sm,self"}}
}()

// testMode is the write mode of the transports the helpers create
// (newPair, contractPair, newFixture): eachFabric sets it per subtest.
// Subtests that set UCX_TLS cannot run in parallel, so one variable does.
var testMode = WriteMessages

// eachFabric runs f once per UCX_TLS setting and write mode. UCX reads the
// variable in New, so it is set before the transports are created.
func eachFabric(t *testing.T, f func(t *testing.T)) {
	eachFabricIn(t, []WriteMode{WriteMessages, WriteRMA}, f)
}

// eachFabricIn is eachFabric in the given write modes only.
func eachFabricIn(t *testing.T, modes []WriteMode, f func(t *testing.T)) {
	for _, fab := range fabrics {
		for _, mode := range modes {
			t.Run(fab.name+"/"+mode.String(), func(t *testing.T) {
				t.Setenv("UCX_TLS", fab.tls)
				testMode = mode
				t.Cleanup(func() { testMode = WriteMessages })
				f(t)
			})
		}
	}
}

// directPeerWrites says whether a peer of the current subtest's transports
// writes their memory itself, which a revocation cannot stop: only over
// UCX's RMA, where UCX_TLS lets it.
func directPeerWrites() bool {
	return testMode == WriteRMA && mayWriteDirectly(os.Getenv("UCX_TLS"))
}

func newPair(t *testing.T) (rdma.Transport, rdma.Transport) {
	t.Helper()
	a, err := New(Options{Name: "prefill", Writes: testMode})
	require.NoError(t, err)
	b, err := New(Options{Name: "decode", Writes: testMode})
	if err != nil {
		_ = a.Close()
	}
	require.NoError(t, err)
	return a, b
}

func TestContract(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		// No SlowPair: UCX has no way to slow a link down. The teardown
		// property is checked by TestCloseLandsNothingMore instead.
		rdmatest.Run(t, rdmatest.Factory{Pair: contractPair, DirectPeerWrites: directPeerWrites()})
	})
}

// contractPair is newPair with a drain bound of a second: over shared
// memory a peer whose access point was revoked is not noticed (see
// doc.go), and its endpoint's Close waits out the drain.
func contractPair(t *testing.T) (rdma.Transport, rdma.Transport) {
	t.Helper()
	a, err := New(Options{Name: "prefill", CloseDrain: time.Second, Writes: testMode})
	require.NoError(t, err)
	b, err := New(Options{Name: "decode", CloseDrain: time.Second, Writes: testMode})
	if err != nil {
		_ = a.Close()
	}
	require.NoError(t, err)
	return a, b
}

type fixture struct {
	from, to *Transport
	src, dst *hostmem.Block
	sreg     rdma.Region
	dreg     rdma.Region
	ep       rdma.Endpoint
	rk       rdma.RemoteKey
}

func newFixture(t testing.TB, n int) *fixture {
	t.Helper()
	return newFixtureOpts(t, n, Options{})
}

func newFixtureOpts(t testing.TB, n int, opts Options) *fixture {
	t.Helper()
	if opts.Writes == WriteMessages {
		opts.Writes = testMode
	}
	opts.Name = "prefill"
	from, err := New(opts)
	require.NoError(t, err)
	opts.Name = "decode"
	to, err := New(opts)
	require.NoError(t, err)
	f := &fixture{from: from, to: to}
	t.Cleanup(func() { _ = f.from.Close(); _ = f.to.Close() })
	f.src, err = hostmem.Alloc(n)
	require.NoError(t, err)
	f.dst, err = hostmem.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.src.Free(); _ = f.dst.Free() }) // runs after the transports closed
	f.sreg, err = from.Register(f.src.Addr, uint64(n))
	require.NoError(t, err)
	f.dreg, err = to.Register(f.dst.Addr, uint64(n))
	require.NoError(t, err)
	f.ep, err = from.Connect(to.Address())
	require.NoError(t, err)
	f.rk, err = f.ep.Import(f.dreg.Desc())
	require.NoError(t, err)
	return f
}

func (f *fixture) write(off, n uint64) rdma.Write {
	return rdma.Write{Src: f.src.Addr + off, Dst: f.dst.Addr + off, Len: n, Local: f.sreg.Key(), Remote: f.rk}
}

func waitErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("batch never completed")
		return nil
	}
}

// TestCloseLandsNothingMore is the teardown check of rdmatest's SlowPair
// done with a batch large enough to still be in flight: post 256 MiB, close
// the endpoint at once, then watch the destination for 200 ms. Close drains
// what UCX already sent, so the batch may complete or fail, but nothing may
// land once Close returned.
func TestCloseLandsNothingMore(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		// Draining 256 MiB into fresh pages takes seconds on a small VM;
		// the property checked is the barrier, not the time.
		closeThenWatch(t, Options{CloseDrain: time.Minute}, true)
	})
}

// TestForcedCloseOverEmulatedPuts shows why Close drains: with the drain
// off (CloseDrain < 0), UCX 1.13 over TCP and shared memory emulates puts
// with messages that the receiver applies, and bytes already sent land after
// the forced close returned. It only reports; run it with
// KVSTREAM_UCX_FORCED=1.
func TestForcedCloseOverEmulatedPuts(t *testing.T) {
	if os.Getenv("KVSTREAM_UCX_FORCED") == "" {
		t.Skip("set KVSTREAM_UCX_FORCED=1 to measure")
	}
	eachFabric(t, func(t *testing.T) {
		closeThenWatch(t, Options{CloseDrain: -1}, false)
	})
}

// fill sets every byte to v by doubling copies: a byte loop over 256 MiB
// is slow under the race detector.
func fill(b []byte, v byte) {
	b[0] = v
	for n := 1; n < len(b); n *= 2 {
		copy(b[n:], b[:n])
	}
}

func closeThenWatch(t *testing.T, opts Options, strict bool) {
	const n = 256 << 20
	const parts = 64 // several puts, as a real batch has
	f := newFixtureOpts(t, n, opts)
	fill(f.src.Bytes, 0xAB)
	ws := make([]rdma.Write, parts)
	for i := range ws {
		ws[i] = f.write(uint64(i)*n/parts, n/parts)
	}
	var calls atomic.Int32
	done := make(chan error, 2)
	require.NoError(t, f.ep.Post(ws, func(err error) { calls.Add(1); done <- err }))
	start := time.Now()
	closeErr := f.ep.Close()
	took := time.Since(start)
	closedAt := append([]byte(nil), f.dst.Bytes...)
	err := waitErr(t, done)
	time.Sleep(200 * time.Millisecond)
	landedAtClose := bytes.Count(closedAt, []byte{0xAB})
	landedLater := bytes.Count(f.dst.Bytes, []byte{0xAB}) - landedAtClose
	t.Logf("Close took %v (err %v); batch: %v; landed when Close returned: %d of %d bytes; landed after: %d",
		took, closeErr, err, landedAtClose, n, landedLater)
	if !strict {
		return
	}
	require.NoError(t, closeErr)
	assert.Equal(t, int32(1), calls.Load(), "done runs exactly once")
	if err != nil {
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	} else {
		assert.Equal(t, n, landedAtClose, "a batch reported complete landed entirely")
	}
	assert.True(t, bytes.Equal(closedAt, f.dst.Bytes), "bytes changed after Close returned (%d more landed)", landedLater)

	err = f.ep.Post(ws[:1], func(error) { t.Error("done after a refused Post") })
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
}

// TestCloseReportsUndrainedWrites stalls the receiver (a done callback of
// its own blocks its progress goroutine), so that the sender's drain cannot
// complete: Close must still return within CloseDrain, fail the batch and
// say that writes may still land, which they then may.
func TestCloseReportsUndrainedWrites(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		const n = 32 << 20
		f := newFixtureOpts(t, n, Options{CloseDrain: 200 * time.Millisecond})
		fill(f.src.Bytes, 0xCD)

		// Stall the receiver: it posts a write back whose done blocks.
		back, err := f.to.Connect(f.from.Address())
		require.NoError(t, err)
		brk, err := back.Import(f.sreg.Desc())
		require.NoError(t, err)
		stalled, release := make(chan struct{}), make(chan struct{})
		require.NoError(t, back.Post([]rdma.Write{{Src: f.dst.Addr, Dst: f.src.Addr, Len: 0, Local: f.dreg.Key(), Remote: brk}},
			func(error) { close(stalled); <-release }))
		<-stalled
		released := false
		defer func() {
			if !released {
				close(release)
			}
		}()

		done := make(chan error, 1)
		require.NoError(t, f.ep.Post([]rdma.Write{f.write(0, n)}, func(err error) { done <- err }))
		start := time.Now()
		closeErr := f.ep.Close()
		took := time.Since(start)
		require.Error(t, closeErr, "the drain cannot complete while the receiver is stalled")
		assert.True(t, errors.Is(closeErr, rdma.ErrEndpointBroken), "%v", closeErr)
		assert.Contains(t, closeErr.Error(), "may still land")
		assert.Less(t, took, 5*time.Second)
		assert.True(t, errors.Is(closeErr, rdma.ErrNotQuiesced), "%v", closeErr)
		err = waitErr(t, done)
		require.Error(t, err)
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
		assert.True(t, errors.Is(err, rdma.ErrNotQuiesced), "the batch's own error says its writes may still land: %v", err)

		closedAt := bytes.Count(f.dst.Bytes, []byte{0xCD})
		close(release)
		released = true
		time.Sleep(200 * time.Millisecond)
		t.Logf("Close took %v: %v; landed when it returned: %d; after the receiver resumed: %d more",
			took, closeErr, closedAt, bytes.Count(f.dst.Bytes, []byte{0xCD})-closedAt)
	})
}

// TestPeerLoss closes the receiving transport under an open endpoint. Over
// TCP the error handler (UCP_ERR_HANDLING_MODE_PEER) fails the endpoint.
// Over shared memory UCX detects a lost peer by its process, which lives on
// here, so the batch hangs until Close: then the drain times out, the
// endpoint is forced closed and the batch fails. Either way nothing hangs.
func TestPeerLoss(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		f := newFixtureOpts(t, 1<<20, Options{CloseDrain: 300 * time.Millisecond})
		ok := make(chan error, 1)
		require.NoError(t, f.ep.Post([]rdma.Write{f.write(0, 4096)}, func(err error) { ok <- err }))
		require.NoError(t, waitErr(t, ok))
		require.NoError(t, f.to.Close())

		ch := make(chan error, 1)
		err := f.ep.Post([]rdma.Write{f.write(0, 4096)}, func(err error) { ch <- err })
		if err == nil {
			select {
			case err = <-ch:
				t.Logf("batch failed by UCX: %v", err)
			case <-time.After(2 * time.Second):
				t.Log("UCX did not notice the lost peer; closing the endpoint")
				closeErr := f.ep.Close()
				require.Error(t, closeErr, "the drain cannot complete")
				assert.True(t, errors.Is(closeErr, rdma.ErrEndpointBroken), "%v", closeErr)
				err = waitErr(t, ch)
			}
		}
		require.Error(t, err, "a write to a closed peer succeeded")
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
		_ = f.ep.Close()
	})
}

// TestDoneMayCallBack checks that done, which runs on the progress
// goroutine, can post and close without deadlocking it.
func TestDoneMayCallBack(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		f := newFixture(t, 1<<16)
		res := make(chan error, 3)
		require.NoError(t, f.ep.Post([]rdma.Write{f.write(0, 64)}, func(err error) {
			if goid() != f.from.loopG {
				t.Error("done ran outside the progress goroutine")
			}
			res <- err
			res <- f.ep.Post([]rdma.Write{f.write(64, 64)}, func(err error) {
				res <- f.ep.Close()
			})
		}))
		for range 3 {
			require.NoError(t, waitErr(t, res))
		}
		err := f.ep.Post([]rdma.Write{f.write(0, 8)}, func(error) {})
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	})
}

// TestCloseFromDone closes the whole transport from a done callback: Close
// only starts the teardown there, which completes once the callback
// returned; a second Close from outside waits for it.
func TestCloseFromDone(t *testing.T) {
	f := newFixture(t, 1<<16)
	res := make(chan error, 1)
	require.NoError(t, f.ep.Post([]rdma.Write{f.write(0, 64)}, func(err error) { res <- f.from.Close() }))
	require.NoError(t, waitErr(t, res))
	require.NoError(t, f.from.Close())
	err := f.ep.Post([]rdma.Write{f.write(0, 8)}, func(error) {})
	assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	_, err = f.from.Connect(f.to.Address())
	assert.True(t, errors.Is(err, ErrClosed), "%v", err)
}

// TestConcurrentPosts posts from several goroutines at once (as the
// submitter pool does) and checks every byte.
func TestConcurrentPosts(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		const (
			posters = 4
			batches = 50
			chunk   = 4096
		)
		n := posters * batches * chunk
		f := newFixture(t, n)
		for i := range f.src.Bytes {
			f.src.Bytes[i] = byte(i*31 + 7)
		}
		var wg sync.WaitGroup
		var calls atomic.Int64
		errs := make(chan error, posters*batches)
		for p := range posters {
			wg.Go(func() {
				for i := range batches {
					off := uint64((p*batches + i) * chunk)
					ws := []rdma.Write{f.write(off, chunk/2), f.write(off+chunk/2, chunk/2)}
					if err := f.ep.Post(ws, func(err error) { calls.Add(1); errs <- err }); err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		for range posters * batches {
			require.NoError(t, waitErr(t, errs))
		}
		assert.Equal(t, int64(posters*batches), calls.Load())
		assert.True(t, bytes.Equal(f.src.Bytes, f.dst.Bytes))
	})
}

func TestRegisterRejectsUnmappedMemory(t *testing.T) {
	tr, err := New(Options{})
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.Register(0x1000, 64)
	require.Error(t, err)
	assert.True(t, errors.Is(err, rdma.ErrInvalidWrite), "%v", err)
	_, err = tr.Register(0x1000, 0)
	require.ErrorContains(t, err, "zero length")
}

// TestDeregisterRefusesLaterWrites checks that writes from a deregistered
// region are rejected in Go rather than handed to UCX.
func TestDeregisterRefusesLaterWrites(t *testing.T) {
	f := newFixture(t, 1<<16)
	require.NoError(t, f.sreg.Deregister())
	require.NoError(t, f.sreg.Deregister(), "twice is a no-op")
	err := f.ep.Post([]rdma.Write{f.write(0, 8)}, func(error) { t.Error("done after a refused Post") })
	assert.True(t, errors.Is(err, rdma.ErrInvalidWrite), "%v", err)
}

// TestOptionsConfigOverridesEnvironment checks the pass-through: a bogus
// transport list from the environment fails New, and Options.Config wins
// over it.
func TestOptionsConfigOverridesEnvironment(t *testing.T) {
	t.Setenv("UCX_TLS", "no_such_transport")
	_, err := New(Options{})
	require.Error(t, err, "UCX_TLS from the environment reaches UCX")
	tr, err := New(Options{Config: map[string]string{"TLS": "tcp"}})
	require.NoError(t, err)
	require.NoError(t, tr.Close())
}

// TestNoWakeup runs batches without UCP_FEATURE_WAKEUP, where the idle
// loop naps instead of sleeping on the event fd, with pauses that let both
// loops fall asleep between batches.
func TestNoWakeup(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		f := newFixtureOpts(t, 1<<16, Options{NoWakeup: true, Spin: -1})
		fill(f.src.Bytes, 0x5A)
		for i := range 4 {
			time.Sleep(5 * time.Millisecond)
			ch := make(chan error, 1)
			require.NoError(t, f.ep.Post([]rdma.Write{f.write(uint64(i)*4096, 4096)}, func(err error) { ch <- err }))
			require.NoError(t, waitErr(t, ch))
		}
		assert.True(t, bytes.Equal(f.src.Bytes[:4*4096], f.dst.Bytes[:4*4096]))
	})
}

// TestGoFaultsStillPanic guards against UCX's signal handlers (installed
// when libucs loads, UCX_HANDLE_ERRORS) taking a Go nil dereference away
// from the Go runtime.
func TestGoFaultsStillPanic(t *testing.T) {
	tr, err := New(Options{})
	require.NoError(t, err)
	defer tr.Close()
	var p *fixture
	assert.Panics(t, func() { _ = p.from })
}

// TestConnectRefusesMalformedAddress: a peer's garbage worker address is an
// error, never an abort inside UCX (which asserts on an unknown format
// version); an address of a known version whose length is wrong is refused
// by UCX itself. A truncated address is not tried: UCX parses an address
// without its length, up to its own "last" flags, so a truncated one is read
// past its end and the outcome depends on the bytes there (accepted in one
// full run of this package in a few; a 19-byte prefix of a TCP address,
// followed by 0xff bytes, aborts UCX in ucp_wireup_select_lanes). doc.go
// ("Limits") says what that leaves to authentication.
func TestConnectRefusesMalformedAddress(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	tr, err := New(Options{Name: "garbage"})
	require.NoError(t, err)
	defer tr.Close()
	good := tr.Address()
	for name, addr := range map[string][]byte{
		"empty":     nil,
		"one byte":  {0},
		"version 2": append([]byte{0x22}, good[1:]...),
		"version f": append([]byte{0x2f}, good[1:]...),
		"too long":  make([]byte, 128<<10),
	} {
		_, err := tr.Connect(addr)
		require.Error(t, err, name)
		require.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%s: %v", name, err)
	}
}

// TestImportRefusesMalformedKey: a peer's packed key whose structure is not
// UCX's (over shared memory UCX asserts on such keys and aborts) is an
// error; this transport's own keys pass. A transport of the message mode
// refuses a UCX key outright: it would need UCX's RMA to write with it.
func TestImportRefusesMalformedKey(t *testing.T) {
	eachFabricIn(t, []WriteMode{WriteRMA}, func(t *testing.T) {
		a, b := newPair(t)
		defer a.Close()
		defer b.Close()
		mem, err := hostmem.Alloc(4096)
		require.NoError(t, err)
		defer mem.Free()
		reg, err := b.Register(mem.Addr, 4096)
		require.NoError(t, err)
		d := reg.Desc()
		require.NoError(t, checkPackedKey(d.Key), "%x", d.Key)
		ep, err := a.Connect(b.Address())
		require.NoError(t, err)
		defer ep.Close()
		more := append([]byte(nil), d.Key...)
		more[7] |= 0x80 // one more domain, whose key is missing
		badType := append([]byte(nil), d.Key...)
		badType[8] = 0xff
		for name, key := range map[string][]byte{
			"short":             d.Key[:5],
			"no domain":         make([]byte, 16),
			"memory type":       badType,
			"a domain too many": more,
			"too long":          make([]byte, 128<<10),
		} {
			_, err := ep.Import(rdma.RegionDesc{Addr: d.Addr, Len: d.Len, Key: key})
			require.True(t, errors.Is(err, rdma.ErrInvalidWrite), "%s: %v", name, err)
		}
		_, err = ep.Import(d)
		require.NoError(t, err)

		m, err := New(Options{Name: "messages"})
		require.NoError(t, err)
		defer m.Close()
		mep, err := m.Connect(b.Address())
		require.NoError(t, err)
		defer mep.Close()
		_, err = mep.Import(d)
		require.True(t, errors.Is(err, rdma.ErrInvalidWrite), "%v", err)
		require.Contains(t, err.Error(), "same write mode")
	})
}

// TestMayWriteDirectly: the transports over which a Revoke cannot confirm
// anything are recognised, conservatively.
func TestMayWriteDirectly(t *testing.T) {
	for tls, want := range map[string]bool{
		"": true, "all": true, "^tcp": true, "sm,self": true, "shm": true, "posix": true, "tcp,sysv": true,
		"cma": true, "knem": true, "xpmem": true, "cuda_ipc": true, "cuda": true, "rc,cuda_copy,cuda_ipc": true, "frobnicate": true,
		"tcp": false, "tcp,self": false, "rc,self": false, "rc_x,ud:aux": false, "ib": false, "dc_x,cuda_copy,gdr_copy": false, `\tcp`: false,
	} {
		assert.Equal(t, want, mayWriteDirectly(tls), "UCX_TLS=%q", tls)
	}
}

// TestMemoryTypeReachesUCX: RegisterTyped's type is in the parameters
// kvs_mem_map hands to ucp_mem_map (the field and the value), Register
// leaves it out for UCX to detect, and Allocate asks for an allocation of
// host memory. On a machine without a GPU that is as far as a test can
// follow a CUDA registration; scripts/gpu-check.sh runs the real one.
func TestMemoryTypeReachesUCX(t *testing.T) {
	const field = fieldMemoryType
	mask, addr, flags, mt := mapParams(0x7000_0000_1000, 4096, rdma.MemoryCUDA, true, false)
	assert.NotZero(t, mask&field, "the memory type field is set")
	assert.Equal(t, ucsCUDA, mt)
	assert.Equal(t, uint64(0x7000_0000_1000), addr)
	assert.Zero(t, flags&flagAllocate)

	mask, _, _, mt = mapParams(0x7000_0000_1000, 4096, rdma.MemoryHost, true, false)
	assert.NotZero(t, mask&field)
	assert.Equal(t, ucsHost, mt)

	mask, _, _, mt = mapParams(0x7000_0000_1000, 4096, 0, false, false)
	assert.Zero(t, mask&field, "Register lets UCX detect the type")
	assert.Equal(t, -1, mt)

	mask, addr, flags, mt = mapParams(0, 4096, rdma.MemoryHost, true, true)
	assert.NotZero(t, flags&flagAllocate, "Allocate allocates")
	assert.Zero(t, addr, "UCX picks the address")
	assert.Equal(t, ucsHost, mt)
	assert.NotZero(t, mask&fieldFlags)

	// Message writes land with memcpy: device memory needs RMA.
	msg, err := New(Options{})
	require.NoError(t, err)
	defer msg.Close()
	_, err = msg.RegisterTyped(0x7000_0000_1000, 4096, rdma.MemoryCUDA)
	assert.True(t, errors.Is(err, rdma.ErrUnsupported), "CUDA memory in message mode: %v", err)

	tr, err := New(Options{Writes: WriteRMA})
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.RegisterTyped(0x1000, 4096, rdma.MemoryType(9))
	assert.True(t, errors.Is(err, rdma.ErrInvalidWrite), "an unknown type: %v", err)
	_, err = tr.RegisterTyped(0x1000, 0, rdma.MemoryCUDA)
	assert.True(t, errors.Is(err, rdma.ErrInvalidWrite), "zero length: %v", err)

	// Host memory registered as host: the packed key says host (byte 8
	// of UCX 1.13's packed key is the memory type, see checkPackedKey).
	mem, err := hostmem.Alloc(4096)
	require.NoError(t, err)
	defer mem.Free()
	reg, err := tr.RegisterTyped(mem.Addr, 4096, rdma.MemoryHost)
	require.NoError(t, err)
	assert.Equal(t, byte(ucsHost), reg.Desc().Key[8])
	// "CUDA memory" that is host memory: a UCX with CUDA support takes
	// it or refuses it by its own check; one without maps it with no
	// memory domain (its packed key says CUDA and names no domain), which
	// RegisterTyped turns into ErrUnsupported.
	reg, err = tr.RegisterTyped(mem.Addr, 4096, rdma.MemoryCUDA)
	if err == nil {
		t.Logf("this UCX registered host memory as CUDA memory: key %x", reg.Desc().Key)
		assert.Equal(t, byte(ucsCUDA), reg.Desc().Key[8], "the packed key carries the type UCX was told")
	} else if cudaSupport() {
		t.Logf("this UCX (with CUDA) refused host memory as CUDA memory: %v", err)
	} else {
		assert.True(t, errors.Is(err, rdma.ErrUnsupported), "%v", err)
		assert.Contains(t, err.Error(), "no memory domain")
	}
}

// cudaSupport reports whether this UCX has CUDA transports.
func cudaSupport() bool {
	out, err := exec.Command("ucx_info", "-d").Output()
	return err == nil && bytes.Contains(out, []byte("cuda"))
}

// TestQueuedBatchesShareAFlush: batches queued while the progress
// goroutine is busy (here: stalled in a done callback) go out with one
// flush, complete in the order they were posted, and all land.
func TestQueuedBatchesShareAFlush(t *testing.T) {
	eachFabric(t, func(t *testing.T) {
		const batches = 10
		f := newFixture(t, batches*4096)
		fill(f.src.Bytes, 0x3C)
		stalled, release := make(chan struct{}), make(chan struct{})
		require.NoError(t, f.ep.Post([]rdma.Write{f.write(0, 0)}, func(err error) { close(stalled); <-release }))
		<-stalled
		before := f.from.flushes.Load()
		order := make(chan int, batches)
		for i := range batches {
			require.NoError(t, f.ep.Post([]rdma.Write{f.write(uint64(i)*4096, 2048), f.write(uint64(i)*4096+2048, 2048)}, func(err error) {
				assert.NoError(t, err)
				order <- i
			}))
		}
		close(release)
		for i := range batches {
			select {
			case got := <-order:
				assert.Equal(t, i, got, "completion order")
			case <-time.After(10 * time.Second):
				t.Fatal("a batch never completed")
			}
		}
		assert.Equal(t, uint64(1), f.from.flushes.Load()-before, "one flush for the batches queued together")
		assert.True(t, bytes.Equal(f.src.Bytes, f.dst.Bytes))
	})
}

// TestMessageWritesAreChecked: in the message mode the receiver applies a
// write only inside a region it registered, whatever the sender claims. A
// sender whose view of a region is forged (its length doubled, here, past
// the Go-side checks a hostile peer would skip) has the write refused: the
// batch fails, the endpoint breaks, and not a byte lands, in the region or
// beyond it. A write to a region the receiver deregistered is refused too,
// even if another region took its slot.
func TestMessageWritesAreChecked(t *testing.T) {
	eachFabricIn(t, []WriteMode{WriteMessages}, func(t *testing.T) {
		const n = 1 << 16
		f := newFixture(t, 2*n)
		fill(f.src.Bytes, 0x5A)
		// The receiver registered only the first half of its block.
		half, err := f.to.Register(f.dst.Addr, n)
		require.NoError(t, err)
		rk, err := f.ep.Import(half.Desc())
		require.NoError(t, err)
		ep := f.ep.(*Endpoint)
		ep.t.mu.Lock()
		ep.remotes[rk].len = 2 * n // the forgery
		ep.t.mu.Unlock()
		require.NoError(t, f.dreg.Deregister()) // only half stays writable
		ch := make(chan error, 1)
		w := rdma.Write{Src: f.src.Addr, Dst: f.dst.Addr + n/2, Len: n, Local: f.sreg.Key(), Remote: rk}
		require.NoError(t, f.ep.Post([]rdma.Write{w}, func(err error) { ch <- err }))
		err = waitErr(t, ch)
		require.Error(t, err, "a write past the receiver's region")
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
		assert.Contains(t, err.Error(), "refused")
		assert.Equal(t, make([]byte, 2*n), f.dst.Bytes, "nothing landed")
		err = f.ep.Post([]rdma.Write{w}, func(error) {})
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "the endpoint is broken after a refusal: %v", err)

		// A region deregistered: its key writes nothing, even once
		// another region took its slot.
		ep2, err := f.from.Connect(f.to.Address())
		require.NoError(t, err)
		defer ep2.Close()
		rk2, err := ep2.Import(half.Desc())
		require.NoError(t, err)
		require.NoError(t, half.Deregister())
		again, err := f.to.Register(f.dst.Addr, n)
		require.NoError(t, err)
		defer again.Deregister()
		w2 := rdma.Write{Src: f.src.Addr, Dst: f.dst.Addr, Len: 4096, Local: f.sreg.Key(), Remote: rk2}
		require.NoError(t, ep2.Post([]rdma.Write{w2}, func(err error) { ch <- err }))
		err = waitErr(t, ch)
		require.Error(t, err, "a write through a deregistered region's key")
		assert.Equal(t, make([]byte, 2*n), f.dst.Bytes, "nothing landed")
	})
}

// TestDefaultsFollowTLS: New pins one socket event per tcp progress
// (UCX_TCP_MAX_POLL, through the environment) wherever UCX_TLS may select
// tcp and Options.Config does not set it, and the shared-memory error
// handling wherever it may select shared memory; a variable for a
// transport not in use would draw UCX's warning.
func TestDefaultsFollowTLS(t *testing.T) {
	for _, c := range []struct {
		tls      string
		tcp, shm bool
	}{
		{"", true, true},
		{"all", true, true},
		{"tcp", true, false},
		{`\tcp,self`, true, false},
		{"sm,self", false, true},
		{"posix,self", false, true},
		{"rc,cuda_copy", false, false},
		{"^ib", true, true},
		{"^tcp", false, true},
		{"^sm", true, false},
		{"^posix", true, true},
		{"^posix,sysv", true, false},
	} {
		o := Options{Config: map[string]string{"TLS": c.tls}}
		got := map[string]string{}
		for _, kv := range o.defaults() {
			got[kv[0]] = kv[1]
		}
		_, shm := got["MM_ERROR_HANDLING"]
		assert.Equal(t, c.shm, shm, "TLS=%q: MM_ERROR_HANDLING set", c.tls)
		assert.NotContains(t, got, "TCP_MAX_POLL", "TLS=%q: a tcp variable goes through the environment", c.tls)
		if c.tcp {
			assert.Equal(t, "1", envDefault(o, "TCP_MAX_POLL"), "TLS=%q", c.tls)
		} else {
			assert.Empty(t, envDefault(o, "TCP_MAX_POLL"), "TLS=%q", c.tls)
		}
	}
	o := Options{Config: map[string]string{"TLS": "tcp", "TCP_MAX_POLL": "4"}}
	assert.Empty(t, envDefault(o, "TCP_MAX_POLL"), "Options.Config sets it")
}

// envDefault is o.envDefaults' value for key ("" if none).
func envDefault(o Options, key string) string {
	for _, kv := range o.envDefaults() {
		if kv[0] == key {
			return kv[1]
		}
	}
	return ""
}

// TestTCPMaxPollReachesUCX: a Transport over tcp leaves UCX_TCP_MAX_POLL=1
// in the C environment UCX reads its configuration from, where the process
// did not set it (through ucp_config_modify, UCX 1.13 applied it to no
// interface).
func TestTCPMaxPollReachesUCX(t *testing.T) {
	if tcpMaxPollAtStart != "" {
		t.Skipf("the environment sets UCX_TCP_MAX_POLL=%s", tcpMaxPollAtStart)
	}
	tr, err := New(Options{Config: map[string]string{"TLS": "tcp"}})
	require.NoError(t, err)
	require.NoError(t, tr.Close())
	assert.Equal(t, "1", cGetenv("UCX_TCP_MAX_POLL"))
}
