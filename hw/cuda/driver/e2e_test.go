package driver_test

import (
	"context"
	"testing"

	"github.com/kvstream/kvstream/hw/cuda/driver"
	"github.com/kvstream/kvstream/lab/gpucheck"
	"github.com/stretchr/testify/require"
)

// TestGPUEngineEndToEnd runs the engine with the prefill pool in device
// memory, kernels and events on a real stream, and every destination byte
// checked (see lab/gpucheck). It skips without a GPU; TestCFakeLibcuda
// runs it against the C stand-in libcuda.
func TestGPUEngineEndToEnd(t *testing.T) {
	dev, err := driver.Open(0)
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	defer dev.Close()
	rep, err := gpucheck.Run(context.Background(), dev, gpucheck.Defaults())
	require.NoError(t, err)
	t.Log(rep)
	require.True(t, rep.BytesEqual, rep.Mismatch)
	require.Equal(t, 4, rep.Chunks)
}
