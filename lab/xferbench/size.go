package xferbench

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
)

// Size is a byte count as a command-line flag value that accepts binary
// suffixes (it implements pflag.Value).
type Size uint64

// String prints the value the way Set accepts it.
func (s *Size) String() string { return FormatBytes(uint64(*s)) }

// Type names the flag's kind in usage.
func (s *Size) Type() string { return "size" }

// Set parses a size; pflag puts the flag name and the value in front of the
// error.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// ParseSize parses "65536", "64K", "64KiB", "1M", "4MiB", "1G": all
// suffixes are powers of 1024 (KB too, as memory sizes are).
func ParseSize(v string) (uint64, error) {
	s := strings.TrimSpace(v)
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, errors.Newf("size %q: want a number of bytes with an optional suffix K, M or G (e.g. 64K, 1M, 4MiB)", v)
	}
	n, err := strconv.ParseUint(s[:i], 10, 64)
	if err != nil {
		return 0, errors.Newf("size %q: %s", v, err.(*strconv.NumError).Err)
	}
	var shift uint
	switch strings.ToLower(strings.TrimSpace(s[i:])) {
	case "", "b":
	case "k", "kb", "ki", "kib":
		shift = 10
	case "m", "mb", "mi", "mib":
		shift = 20
	case "g", "gb", "gi", "gib":
		shift = 30
	default:
		return 0, errors.Newf("size %q: unknown suffix %q (use K, M or G, e.g. 64K, 1M, 4MiB)", v, s[i:])
	}
	if n == 0 {
		return 0, errors.Newf("size %q: must be positive", v)
	}
	if n > (1<<64-1)>>shift {
		return 0, errors.Newf("size %q: too large", v)
	}
	return n << shift, nil
}

// FormatBytes prints n with the largest binary unit that divides it, in a
// form ParseSize reads back.
func FormatBytes(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
