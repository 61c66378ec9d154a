//go:build ucx

package ucx

import (
	"syscall"

	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"github.com/cockroachdb/errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A peer process, for benchmarks laid out like ucx_perftest (sender and
// receiver in different processes): the test binary re-executed with
// peerEnv set registers a region of peerEnv bytes, prints its worker
// address and region descriptor on stdout, and serves until stdin closes.
const peerEnv = "KVSTREAM_UCX_PEER_BYTES"

func runPeer() int {
	n, err := strconv.Atoi(os.Getenv(peerEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	tr, err := New(Options{Name: "peer"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer tr.Close()
	mem, err := hostmem.Alloc(n)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	reg, err := tr.Register(mem.Addr, uint64(n))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	d := reg.Desc()
	fmt.Printf("%s %d %d %s\n", hex.EncodeToString(tr.Address()), d.Addr, d.Len, hex.EncodeToString(d.Key))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// remotePeer starts a peer process and returns its address and region.
func remotePeer(tb testing.TB, n int) (addr []byte, desc rdma.RegionDesc) {
	tb.Helper()
	addr, desc, _ = remotePeerProc(tb, n)
	return addr, desc
}

// remotePeerProc is remotePeer that also returns the process, for tests
// that stop or kill it.
func remotePeerProc(tb testing.TB, n int) (addr []byte, desc rdma.RegionDesc, proc *os.Process) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", peerEnv, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	require.NoError(tb, cmd.Start())
	tb.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	var a, k string
	_, err = fmt.Fscan(bufio.NewReader(stdout), &a, &desc.Addr, &desc.Len, &k)
	require.NoError(tb, err)
	addr, err = hex.DecodeString(a)
	require.NoError(tb, err)
	desc.Key, err = hex.DecodeString(k)
	require.NoError(tb, err)
	return addr, desc, cmd.Process
}

// BenchmarkPutRemote is BenchmarkPut with the receiver in its own process,
// as ucx_perftest runs: the comparison that does not charge two progress
// loops and the benchmark to one Go runtime.
func BenchmarkPutRemote(b *testing.B) {
	const window = 64
	for _, fab := range fabrics {
		for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
			for _, writes := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/%dKiB/writes=%d", fab.name, size>>10, writes), func(b *testing.B) {
					b.Setenv("UCX_TLS", fab.tls)
					addr, desc := remotePeer(b, size)
					from, err := New(Options{Name: "prefill"})
					require.NoError(b, err)
					b.Cleanup(func() { _ = from.Close() })
					src, err := hostmem.Alloc(size)
					require.NoError(b, err)
					b.Cleanup(func() { _ = src.Free() })
					sreg, err := from.Register(src.Addr, uint64(size))
					require.NoError(b, err)
					ep, err := from.Connect(addr)
					require.NoError(b, err)
					rk, err := ep.Import(desc)
					require.NoError(b, err)
					ws := make([]rdma.Write, writes)
					for i := range ws {
						ws[i] = rdma.Write{Src: src.Addr, Dst: desc.Addr, Len: uint64(size), Local: sreg.Key(), Remote: rk}
					}
					runPuts(b, ep, ws, size, window/writes)
					require.NoError(b, ep.Close())
				})
			}
		}
	}
}

// A receiving process for TestRevokedPeerKeepsWriting: the test binary
// re-executed with revokePeerEnv set registers revokePeerEnv bytes, opens an
// access point and prints "<address> <addr> <len> <key>" (hex, decimal,
// decimal, hex). Then it answers commands on stdin, one per line:
//
//	revoke  Revoke the access point, deregister the region and unmap its
//	        memory (what a decode server does with a lost session's pages),
//	        then open a second access point and region: "revoked <address>
//	        <addr> <len> <key>", or "error <message>".
//	check   Compare the second region with the pattern the test wrote
//	        there: "ok" or "bad <first differing offset>".
//
// It exits 0 when stdin closes. A write applied into the unmapped memory
// would kill it with SIGSEGV: the test sees the exit status.
const revokePeerEnv = "KVSTREAM_UCX_REVOKE_PEER_BYTES"

func runRevokePeer() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "revoke peer:", err); return 1 }
	n, err := strconv.Atoi(os.Getenv(revokePeerEnv))
	if err != nil {
		return fail(err)
	}
	tr, err := New(Options{Name: "revoke-peer"})
	if err != nil {
		return fail(err)
	}
	defer tr.Close()
	open := func() (rdma.PeerAccess, *hostmem.Block, rdma.Region, error) {
		a, err := tr.OpenPeerAccess()
		if err != nil {
			return nil, nil, nil, err
		}
		mem, err := hostmem.Alloc(n)
		if err != nil {
			return nil, nil, nil, err
		}
		reg, err := tr.Register(mem.Addr, uint64(n))
		return a, mem, reg, err
	}
	line := func(a rdma.PeerAccess, reg rdma.Region) string {
		d := reg.Desc()
		return fmt.Sprintf("%s %d %d %s", hex.EncodeToString(a.Address()), d.Addr, d.Len, hex.EncodeToString(d.Key))
	}
	a, mem, reg, err := open()
	if err != nil {
		return fail(err)
	}
	fmt.Println(line(a, reg))
	var second *hostmem.Block
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "revoke":
			if err := a.Revoke(); err != nil {
				fmt.Println("error", err)
				continue
			}
			if err := reg.Deregister(); err != nil {
				fmt.Println("error", err)
				continue
			}
			if err := mem.Free(); err != nil {
				fmt.Println("error", err)
				continue
			}
			var reg2 rdma.Region
			if a, second, reg2, err = open(); err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("revoked", line(a, reg2))
		case "check":
			want := make([]byte, n)
			fillPattern(want)
			if i := firstDiff(want, second.Bytes); i >= 0 {
				fmt.Println("bad", i)
			} else {
				fmt.Println("ok")
			}
		}
	}
	return 0
}

func fillPattern(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestRevokedPeerKeepsWriting: a receiving process revokes the access point
// its peer writes through, with a window of batches in flight, and unmaps
// the memory at once; the peer (this test) goes on posting and
// reconnecting. The receiver must survive (its exit status), and a second
// access point must work afterwards. Over TCP only: over shared memory a
// Revoke answers ErrNotQuiesced and the memory must not be unmapped.
func TestRevokedPeerKeepsWriting(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const n = 1 << 20
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", revokePeerEnv, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = stdin.Close()
			_ = cmd.Wait()
		}
	})
	out := bufio.NewReader(stdout)
	readTarget := func(prefix string) (addr []byte, d rdma.RegionDesc) {
		t.Helper()
		l, err := out.ReadString('\n')
		require.NoError(t, err)
		var a, k string
		f := strings.Fields(l)
		require.True(t, len(f) == 4 || (len(f) == 5 && f[0] == prefix), "receiver said %q", l)
		_, err = fmt.Sscan(strings.Join(f[len(f)-4:], " "), &a, &d.Addr, &d.Len, &k)
		require.NoError(t, err)
		addr, err = hex.DecodeString(a)
		require.NoError(t, err)
		d.Key, err = hex.DecodeString(k)
		require.NoError(t, err)
		return addr, d
	}
	addr, desc := readTarget("")

	from, err := New(Options{Name: "writer", CloseDrain: 200 * time.Millisecond})
	require.NoError(t, err)
	defer from.Close()
	src, err := hostmem.Alloc(n)
	require.NoError(t, err)
	defer src.Free()
	fillPattern(src.Bytes)
	sreg, err := from.Register(src.Addr, n)
	require.NoError(t, err)

	// The writer: a window of 64 KiB batches into the first region, and on
	// every failure a fresh endpoint to the same address, until stopped.
	stop, stopped := make(chan struct{}), make(chan struct{})
	var ok, failed atomic.Int64
	go func() {
		defer close(stopped)
		slots := make(chan struct{}, 16)
		for {
			ep, err := from.Connect(addr)
			if err != nil {
				failed.Add(1)
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				continue
			}
			rk, err := ep.Import(desc)
			for i := 0; err == nil; i++ {
				select {
				case slots <- struct{}{}:
				case <-stop:
					_ = ep.Close()
					return
				}
				off := uint64(i%16) * (64 << 10)
				err = ep.Post([]rdma.Write{{Src: src.Addr + off, Dst: desc.Addr + off, Len: 64 << 10, Local: sreg.Key(), Remote: rk}}, func(err error) {
					if err == nil {
						ok.Add(1)
					} else {
						failed.Add(1)
					}
					<-slots
				})
				if err != nil {
					<-slots
				}
			}
			failed.Add(1)
			_ = ep.Close()
		}
	}()
	require.Eventually(t, func() bool { return ok.Load() >= 64 }, time.Minute, time.Millisecond, "writes do not flow")

	_, err = io.WriteString(stdin, "revoke\n")
	require.NoError(t, err)
	addr2, desc2 := readTarget("revoked")
	okAtRevoke := ok.Load()
	// The writer goes on: failed posts and reconnections to the revoked
	// address, while the receiver has unmapped the memory.
	require.Eventually(t, func() bool { return failed.Load() >= 20 }, time.Minute, time.Millisecond, "the writer never noticed the revoke")
	close(stop)
	<-stopped
	t.Logf("writes before the revoke: %d; after it: %d succeeded (in flight at the revoke), %d failures", okAtRevoke, ok.Load()-okAtRevoke, failed.Load())

	// The receiver lives, and a second access point works.
	ep, err := from.Connect(addr2)
	require.NoError(t, err)
	rk, err := ep.Import(desc2)
	require.NoError(t, err)
	done := make(chan error, 1)
	require.NoError(t, ep.Post([]rdma.Write{{Src: src.Addr, Dst: desc2.Addr, Len: n, Local: sreg.Key(), Remote: rk}}, func(err error) { done <- err }))
	require.NoError(t, waitErr(t, done))
	require.NoError(t, ep.Close())
	_, err = io.WriteString(stdin, "check\n")
	require.NoError(t, err)
	l, err := out.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "ok\n", l, "the second region holds the bytes written through the second access point")
	require.NoError(t, stdin.Close())
	exited = true
	require.NoError(t, cmd.Wait(), "the receiving process survived")
}

// TestPeerKilledWhileAwaited: a receiving process that stops (SIGSTOP)
// with a batch of this side's in flight, and is then killed: the sender,
// whose writes all left and which waits for the receiver's answer on an
// idle connection, still learns of the death. Over TCP the socket's reset
// fails the batch at once. Over shared memory nothing tells a sender that
// the process behind a FIFO died (UCX's keepalive does not check these
// endpoints): the batch stays in flight until the endpoint's Close, whose
// drain ends within its bound and says writes may still land; the control
// plane's heartbeats are what notice such a peer (docs/RELIABILITY.md).
func TestPeerKilledWhileAwaited(t *testing.T) {
	for _, fab := range fabrics {
		t.Run(fab.name, func(t *testing.T) {
			t.Setenv("UCX_TLS", fab.tls)
			const n = 1 << 20
			const drain = 200 * time.Millisecond
			addr, desc, proc := remotePeerProc(t, n)
			defer proc.Kill() // a stopped child would hold the test's output open
			from, err := New(Options{Name: "prefill", CloseDrain: drain})
			require.NoError(t, err)
			defer from.Close()
			src, err := hostmem.Alloc(n)
			require.NoError(t, err)
			defer src.Free()
			sreg, err := from.Register(src.Addr, n)
			require.NoError(t, err)
			ep, err := from.Connect(addr)
			require.NoError(t, err)
			defer ep.Close()
			rk, err := ep.Import(desc)
			require.NoError(t, err)
			w := []rdma.Write{{Src: src.Addr, Dst: desc.Addr, Len: n, Local: sreg.Key(), Remote: rk}}
			ok := make(chan error, 1)
			require.NoError(t, ep.Post(w, func(err error) { ok <- err }))
			require.NoError(t, waitErr(t, ok), "a batch to the live peer")

			require.NoError(t, proc.Signal(syscall.SIGSTOP))
			// kill(2) returns once the signal is queued: the receiver may
			// still run, and answer a batch, until the kernel stops it.
			waitStopped(t, proc.Pid)
			done := make(chan error, 1)
			require.NoError(t, ep.Post(w, func(err error) { done <- err }))
			select {
			case err := <-done:
				t.Fatalf("a batch completed while its receiver was stopped: %v", err)
			case <-time.After(300 * time.Millisecond):
			}
			killed := time.Now()
			require.NoError(t, proc.Kill())
			if fab.name == "tcp" {
				select {
				case err := <-done:
					require.Error(t, err)
					assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
					t.Logf("failed %v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
				case <-time.After(20 * time.Second):
					t.Fatal("the batch to a killed receiver did not fail within 20s")
				}
				return
			}
			start := time.Now()
			cerr := ep.Close()
			require.Error(t, cerr, "a drain nobody answers")
			assert.True(t, errors.Is(cerr, rdma.ErrNotQuiesced), "%v", cerr)
			assert.Less(t, time.Since(start), drain+10*time.Second, "Close is bounded by its drain and close timeouts")
			err = waitErr(t, done)
			require.Error(t, err)
			assert.True(t, errors.Is(err, rdma.ErrNotQuiesced), "%v", err)
		})
	}
}

// waitStopped waits until process pid is stopped (state T in
// /proc/PID/stat), within a bound.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		require.NoError(t, err)
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not stopped 10s after SIGSTOP: %s", pid, stat)
		}
		time.Sleep(time.Millisecond)
	}
}
