package hostmem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAllocLookupFree(t *testing.T) {
	a, err := Alloc(8192)
	require.NoError(t, err)
	b, err := Alloc(4096)
	require.NoError(t, err)
	a.Bytes[100] = 7
	got, err := Lookup(a.Addr+100, 10)
	require.NoError(t, err)
	assert.Equal(t, byte(7), got[0])
	got[1] = 9
	assert.Equal(t, byte(9), a.Bytes[101], "lookup aliases the block")

	_, err = Lookup(a.Addr+8190, 10)
	require.ErrorContains(t, err, "runs past the block")
	_, err = Lookup(b.Addr+4096+1<<40, 1)
	require.Error(t, err)

	require.NoError(t, a.Free())
	_, err = Lookup(a.Addr, 1)
	require.Error(t, err, "a freed block is not found")
	require.NoError(t, b.Free())
	_, err = Alloc(0)
	require.ErrorContains(t, err, "allocation of 0 bytes")
}

// TestLargeBlocksAskForHugePages: a pool-sized block is zeroed, usable, and
// (where the kernel offers transparent huge pages on request) backed by
// huge pages, which the sim's copies depend on (see hugePage).
func TestLargeBlocksAskForHugePages(t *testing.T) {
	const n = 16 << 20
	b, err := Alloc(n)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Free()) }()
	for i := 0; i < n; i += pageSize {
		require.Zero(t, b.Bytes[i], "byte %d of a fresh block", i)
	}
	b.Bytes[n-1] = 1

	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || !(bytes.Contains(mode, []byte("[always]")) || bytes.Contains(mode, []byte("[madvise]"))) {
		t.Skipf("transparent huge pages not offered on request here (%q, %v)", mode, err)
	}
	kb := anonHugeKB(t, b.Addr)
	// 16 MiB not 2 MiB aligned hold at least seven aligned huge pages.
	assert.GreaterOrEqual(t, kb, 2048, "AnonHugePages of the block's mapping, in kB")
}

// anonHugeKB reads the AnonHugePages of the mapping holding addr from
// /proc/self/smaps.
func anonHugeKB(t *testing.T, addr uint64) int {
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uint64
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 && strings.Contains(line[:strings.IndexByte(line, ' ')], "-") {
			in = addr >= lo && addr < hi
			continue
		}
		if kb, ok := strings.CutPrefix(line, "AnonHugePages:"); ok && in {
			v, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")))
			require.NoError(t, err, "smaps line %q", line)
			return v
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no mapping holds %#x in /proc/self/smaps", addr)
	return 0
}
