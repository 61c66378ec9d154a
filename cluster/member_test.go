package cluster_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/cluster"
)

// TestGroup: a CP group is complete only with every rank once.
func TestGroup(t *testing.T) {
	r := func(rank, size int) cluster.Member {
		return prefill("g0-r"+string(rune('0'+rank)), "127.0.0.1:9100", "g0", rank, size)
	}
	other := prefill("g1-r0", "127.0.0.1:9200", "g1", 0, 1)
	d := decode("decode-1", "127.0.0.1:9001")

	got, err := cluster.Group([]cluster.Member{r(2, 3), d, r(0, 3), other, r(1, 3)}, "g0")
	require.NoError(t, err)
	require.Equal(t, []cluster.Member{r(0, 3), r(1, 3), r(2, 3)}, got, "ordered by rank, other groups and roles left out")

	_, err = cluster.Group([]cluster.Member{r(0, 3), r(2, 3)}, "g0")
	requireIs(t, err, cluster.ErrNotFound)
	require.ErrorContains(t, err, "ranks [1] not registered")
	_, err = cluster.Group([]cluster.Member{d}, "g0")
	requireIs(t, err, cluster.ErrNotFound)
	_, err = cluster.Group([]cluster.Member{r(0, 2), r(1, 3)}, "g0")
	requireIs(t, err, cluster.ErrInvalid)
	require.ErrorContains(t, err, "size")
	dup := r(0, 2)
	dup.ID = "g0-again"
	_, err = cluster.Group([]cluster.Member{r(0, 2), dup, r(1, 2)}, "g0")
	requireIs(t, err, cluster.ErrInvalid)
	require.ErrorContains(t, err, "rank 0 registered twice")
}
