package hostmem

import (
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
