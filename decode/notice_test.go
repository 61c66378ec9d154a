package decode

import (
	stderrors "errors"
	"testing"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNoticeForTakesAbsolutePositions(t *testing.T) {
	res := messages.Result{Status: messages.Succeeded}
	spec := plan.ChunkSpec{Room: 4, Start: 32, End: 70, SrcPages: []int{9, 8, 7}, TotalPages: 6,
		Infos: []plan.DecodeInfo{{Peer: "other", DstPages: []int{0, 0, 0, 0, 0, 0}}, {Peer: "d", DstPages: []int{50, 51, 52, 53, 54, 55}}}}

	// Tokens [32, 70) of a non-last chunk send whole pages only: [32, 64),
	// positions 2 and 3 of the request (not 0 and 1).
	n, err := noticeFor("d", 16, cp.CP{}, spec, res)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 3}, n.Positions)
	assert.Equal(t, []int{52, 53}, n.DstPages)
	assert.False(t, n.Last)

	// Rank 1 of 2 under the shared-KV rule owns the odd positions.
	n, err = noticeFor("d", 16, cp.CP{Size: 2, Rank: 1, Rule: cp.SharedKV}, spec, res)
	require.NoError(t, err)
	assert.Equal(t, []int{3}, n.Positions)
	assert.Equal(t, []int{53}, n.DstPages)

	spec.Last = true
	n, err = noticeFor("d", 16, cp.CP{}, spec, res)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 3, 4}, n.Positions, "the last chunk keeps its partial page")
	assert.True(t, n.Last)

	_, err = noticeFor("absent", 16, cp.CP{}, spec, res)
	assert.True(t, stderrors.Is(public(err), ErrBadInput))
	assert.EqualError(t, err, `room 4: no destination at peer "absent" among the chunk's 2 decode infos`)
	spec.SrcPages = spec.SrcPages[:2]
	_, err = noticeFor("d", 16, cp.CP{}, spec, res)
	assert.EqualError(t, err, "room 4 chunk [32, 70): 2 source pages, the range needs 3")
}
