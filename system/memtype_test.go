package system

import (
	"testing"

	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// typedTransport records the memory type of every registration, as a
// transport that takes it (UCX) would receive it.
type typedTransport struct {
	*loopback.Transport
	types []rdma.MemoryType
}

func (t *typedTransport) RegisterTyped(addr, length uint64, mt rdma.MemoryType) (rdma.Region, error) {
	t.types = append(t.types, mt)
	return t.Register(addr, length)
}

// TestBuffersRegisterWithTheirMemoryType: a buffer's Memory reaches the
// transport's registration (UCX picks its GPU paths for CUDA memory only
// when told).
func TestBuffersRegisterWithTheirMemoryType(t *testing.T) {
	lb, err := loopback.NewFabric(loopback.Options{}).NewTransport("p")
	require.NoError(t, err)
	defer lb.Close()
	tr := &typedTransport{Transport: lb}
	src, err := hostmem.Alloc(2 * itemLen * pages)
	require.NoError(t, err)
	defer src.Free()
	bufs := MLABuffers([]uint64{src.Addr, src.Addr + itemLen*pages}, itemLen, pages)
	bufs[1].Memory = rdma.MemoryCUDA
	e, err := New(Config{Buffers: bufs, HookLayers: 2, PageSize: 4}, WithTransport(tr), withSimulated(), WithLogger(zap.NewNop()))
	require.NoError(t, err)
	require.NoError(t, e.Close())
	require.Equal(t, []rdma.MemoryType{rdma.MemoryHost, rdma.MemoryCUDA}, tr.types)
}
