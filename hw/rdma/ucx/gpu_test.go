//go:build ucx

package ucx

// CUDA memory over UCX, on a machine with a GPU and a UCX built with CUDA
// support (scripts/gpu-check.sh's UCX step builds and runs it there). It
// skips, saying why, where either is missing: no machine of this project
// without a GPU can run it.

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/driver"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCUDAMemoryOverUCX writes host memory into device memory registered
// with RegisterTyped(MemoryCUDA), and device memory into host memory, over
// UCX's default transports and over tcp with cuda_copy, and checks the
// bytes through cuMemcpy.
func TestCUDAMemoryOverUCX(t *testing.T) {
	dev, err := driver.Open(0)
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	if !cudaSupport() {
		t.Skipf("GPU found: %s, but this UCX has no CUDA transports (ucx_info -d lists none): build UCX with --with-cuda", dev.Name())
	}
	t.Logf("GPU found: %s; UCX has CUDA transports", dev.Name())
	const n = 4 << 20
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*31 + 7)
	}
	for _, tls := range []string{"", "tcp,cuda_copy"} {
		name := tls
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			if tls != "" {
				t.Setenv("UCX_TLS", tls)
			}
			p, err := dev.Alloc(n)
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, dev.Free(p)) })
			require.NoError(t, dev.MemsetD8(p, 0, n))
			host, err := hostmem.Alloc(n)
			require.NoError(t, err)
			t.Cleanup(func() { _ = host.Free() })

			a, err := New(Options{Name: "host"})
			require.NoError(t, err)
			b, err := New(Options{Name: "gpu"})
			require.NoError(t, err)
			t.Cleanup(func() { _ = a.Close(); _ = b.Close() }) // before the memory is freed

			copy(host.Bytes, want)
			hreg, err := a.Register(host.Addr, n)
			require.NoError(t, err)
			dreg, err := b.RegisterTyped(uint64(p), n, rdma.MemoryCUDA)
			require.NoError(t, err)
			assert.Equal(t, byte(ucsCUDA), dreg.Desc().Key[8], "the key says CUDA")

			// Host to device.
			ep, err := a.Connect(b.Address())
			require.NoError(t, err)
			rk, err := ep.Import(dreg.Desc())
			require.NoError(t, err)
			postWait(t, ep, rdma.Write{Src: host.Addr, Dst: uint64(p), Len: n, Local: hreg.Key(), Remote: rk})
			got := make([]byte, n)
			require.NoError(t, dev.CopyDtoH(got, p))
			assert.True(t, bytes.Equal(want, got), "host → device: the device holds the bytes")

			// Device to host: the device memory as a source.
			clear(host.Bytes)
			back, err := b.Connect(a.Address())
			require.NoError(t, err)
			hk, err := back.Import(hreg.Desc())
			require.NoError(t, err)
			postWait(t, back, rdma.Write{Src: uint64(p), Dst: host.Addr, Len: n, Local: dreg.Key(), Remote: hk})
			assert.True(t, bytes.Equal(want, host.Bytes), "device → host")
			require.NoError(t, ep.Close())
			require.NoError(t, back.Close())
		})
	}
}

func postWait(t *testing.T, ep rdma.Endpoint, w rdma.Write) {
	t.Helper()
	done := make(chan error, 1)
	require.NoError(t, ep.Post([]rdma.Write{w}, func(err error) { done <- err }))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the write never completed")
	}
}
