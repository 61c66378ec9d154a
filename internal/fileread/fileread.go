package fileread

import (
	"io"
	"os"

	"github.com/cockroachdb/errors"
)

// ErrTooLong marks a file longer than the bound it was read within.
var ErrTooLong = errors.New("longer than the bound")

// Read returns path's content, at most max bytes: a longer file is an
// error marked ErrTooLong, read no further than one byte past the bound.
func Read(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read only
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, errors.Mark(errors.Newf("%s: longer than the bound of %d bytes", path, max), ErrTooLong)
	}
	return b, nil
}
