package driver

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

//go:embed testdata/fakecuda.c
var fakeCudaSource []byte

// TestCFakeLibcuda checks the purego bindings end to end without a GPU: it
// compiles testdata/fakecuda.c (the cuda.h prototypes over host memory and a
// time model) into a libcuda.so.1, then re-runs this test binary with that
// library first on LD_LIBRARY_PATH, so that the GPU tests and benchmarks
// run through dlopen, dlsym and real C calls on real OS threads (argument
// and result passing, out-parameters, C strings, the per-thread context).
// It needs a C compiler; the library under test never does.
func TestCFakeLibcuda(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("inside the fake-libcuda child")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler to build the fake libcuda: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fakecuda.c")
	require.NoError(t, os.WriteFile(src, fakeCudaSource, 0o600))
	lib := filepath.Join(dir, LibraryName)
	out, err := exec.Command(cc, "-O2", "-shared", "-fPIC", "-o", lib, src, "-lpthread").CombinedOutput()
	require.NoError(t, err, "building the fake libcuda: %s", out)

	cmd := exec.Command(os.Args[0], "-test.v", "-test.count=1",
		"-test.run", "^(TestGPU|TestOpenWithoutDriverFailsCleanly)",
		"-test.bench", "^Benchmark(Record|Query)$", "-test.benchtime", "200x")
	cmd.Env = append(os.Environ(), childEnv+"=1", "LD_LIBRARY_PATH="+dir)
	out, err = cmd.CombinedOutput()
	text := string(out)
	if err != nil || strings.Contains(text, "--- SKIP") || strings.Contains(text, "--- FAIL") {
		t.Logf("child output:\n%s", text)
	}
	require.NoError(t, err)
	assert.Contains(t, text, "GPU found: kvstream fakecuda (device 0)")
	assert.Contains(t, text, "--- PASS: TestGPUEngineEndToEnd", "the engine ran end to end on the stand-in driver")
	assert.Contains(t, text, "bytes equal: true")
	assert.Contains(t, text, "a CUDA driver is present")
	assert.NotContains(t, text, "--- SKIP")
	for _, name := range []string{"BenchmarkRecord", "BenchmarkQuery"} {
		assert.Regexp(t, name+`-\d+\s+200\s`, text)
	}
}
