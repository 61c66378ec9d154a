package driver

import (
	"fmt"
	"os"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(closingM{m}) }

// closingM closes the shared GPU device after the tests, before goleak
// looks for leftovers.
type closingM struct{ m *testing.M }

func (c closingM) Run() int {
	code := c.m.Run()
	if err := closeGPU(); err != nil {
		fmt.Fprintln(os.Stderr, "closing the GPU device:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// On a machine without the NVIDIA driver, Open must fail with a marked,
// readable error, not panic. Where a driver is present the test checks the
// missing-library path with a name that cannot exist.
func TestOpenWithoutDriverFailsCleanly(t *testing.T) {
	d, err := Open(0)
	if err == nil {
		require.NoError(t, d.Close())
		t.Log("a CUDA driver is present; Open(0) succeeded")
	} else {
		t.Logf("Open(0): %v", err)
		assert.True(t, errors.Is(err, ErrNoDriver) || errors.Is(err, ErrNoDevice), "unmarked: %v", err)
		assert.Contains(t, err.Error(), "cuda driver:")
		assert.False(t, errors.Is(err, cuda.ErrDeviceLost))
		// The failure is remembered: a second Open says the same and
		// does not retry dlopen/cuInit.
		_, err2 := Open(1)
		if errors.Is(err, ErrNoDriver) {
			assert.True(t, errors.Is(err2, ErrNoDriver))
		}
	}

	_, err = loadLibrary("libkvstream-no-such-driver.so.1")
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoDriver))
	assert.False(t, errors.Is(err, ErrNoDevice))
	assert.Contains(t, err.Error(), "cuda driver: libkvstream-no-such-driver.so.1 not found")
}

func TestErrorFormatAndNames(t *testing.T) {
	for _, c := range []struct {
		code Result
		want string
	}{
		{0, "CUDA_SUCCESS"},
		{1, "CUDA_ERROR_INVALID_VALUE"},
		{2, "CUDA_ERROR_OUT_OF_MEMORY"},
		{3, "CUDA_ERROR_NOT_INITIALIZED"},
		{4, "CUDA_ERROR_DEINITIALIZED"},
		{100, "CUDA_ERROR_NO_DEVICE"},
		{101, "CUDA_ERROR_INVALID_DEVICE"},
		{201, "CUDA_ERROR_INVALID_CONTEXT"},
		{400, "CUDA_ERROR_INVALID_HANDLE"},
		{600, "CUDA_ERROR_NOT_READY"},
		{700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
		{719, "CUDA_ERROR_LAUNCH_FAILED"},
		{999, "CUDA_ERROR_UNKNOWN"},
		{4242, "CUDA_ERROR_4242"},
	} {
		assert.Equal(t, c.want, c.code.String())
	}

	err := newError(nil, "cuEventRecord", 400)
	assert.Equal(t, "cuEventRecord: CUDA_ERROR_INVALID_HANDLE (400)", err.Error())
	code, ok := Code(err)
	assert.True(t, ok)
	assert.Equal(t, Result(400), code)

	// Wrapping keeps the code reachable; marked (device-lost) errors too.
	code, ok = Code(errors.Wrap(newError(nil, "cuEventQuery", 700), "group 3"))
	assert.True(t, ok)
	assert.Equal(t, Result(700), code)
	_, ok = Code(errors.New("other"))
	assert.False(t, ok)

	e := &Error{Op: "cuMemAlloc", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"}
	assert.Equal(t, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", e.Error())
}

func TestDeviceLostClassification(t *testing.T) {
	lost := []Result{3, 4, 46, 201, 214, 220, 226, 700, 702, 709, 710, 714, 715, 716, 717, 718, 719, 721, 810, 911, 999}
	fine := []Result{1, 2, 34, 100, 101, 200, 209, 400, 401, 500, 600, 701, 703, 704, 720, 800, 801, 900, 909}
	for _, r := range lost {
		assert.True(t, r.DeviceLost(), "%d %s", r, r)
		err := newError(nil, "cuEventQuery", r)
		assert.True(t, errors.Is(err, cuda.ErrDeviceLost), "%d must be marked device lost", r)
	}
	for _, r := range fine {
		assert.False(t, r.DeviceLost(), "%d %s", r, r)
		assert.False(t, errors.Is(newError(nil, "cuEventQuery", r), cuda.ErrDeviceLost), "%d", r)
	}
	// The mark survives wrapping by callers.
	assert.True(t, errors.Is(errors.Wrap(newError(nil, "cuEventQuery", 700), "wait"), cuda.ErrDeviceLost))
}

func TestGoString(t *testing.T) {
	b := []byte("CUDA_ERROR_X\x00garbage")
	assert.Equal(t, "CUDA_ERROR_X", goString(&b[0]))
	assert.Equal(t, "", goString(nil))
}
