//go:build !(darwin || freebsd || linux || netbsd)

package driver

import (
	"runtime"

	"github.com/cockroachdb/errors"
)

// loadLibrary fails: purego has no dlopen on this OS, and NVIDIA ships
// libcuda.so.1 for Linux only.
func loadLibrary(path string) (*api, error) {
	return nil, errors.Mark(errors.Newf("cuda driver: %s not supported on %s", path, runtime.GOOS), ErrNoDriver)
}
