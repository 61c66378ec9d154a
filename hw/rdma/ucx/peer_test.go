//go:build ucx

package ucx

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
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
	return addr, desc
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
