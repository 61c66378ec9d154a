package fileread

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A file of the bound is read whole; one byte more, or an endless file,
// is refused, marked ErrTooLong; a missing file is the open's error.
func TestReadWithinTheBound(t *testing.T) {
	dir := t.TempDir()
	at := filepath.Join(dir, "at")
	require.NoError(t, os.WriteFile(at, make([]byte, 64), 0o600))
	b, err := Read(at, 64)
	require.NoError(t, err)
	assert.Len(t, b, 64)

	_, err = Read(at, 63)
	require.True(t, errors.Is(err, ErrTooLong), "%v", err)
	assert.Contains(t, err.Error(), "longer than the bound of 63 bytes")

	_, err = Read("/dev/zero", 1<<10)
	require.True(t, errors.Is(err, ErrTooLong), "%v", err)

	_, err = Read(filepath.Join(dir, "missing"), 64)
	require.True(t, errors.Is(err, os.ErrNotExist), "%v", err)
}
