package simsession

import (
	"errors"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/stretchr/testify/assert"
)

// Notices answered late are settled only by a complete goodbye of a run
// not cut short, with no chunk failed; without any, nothing is to settle.
func TestLateSettledByTheGoodbyeOnly(t *testing.T) {
	none := &Prefill{}
	assert.True(t, none.LateSettled(decode.Summary{Failed: 1}, errors.New("room 3 not complete"), nil), "no late notice: nothing to settle")

	p := &Prefill{unanswered: 2}
	assert.True(t, p.LateSettled(decode.Summary{Chunks: 32}, nil, nil))
	assert.False(t, p.LateSettled(decode.Summary{Chunks: 32, Failed: 1}, nil, nil), "a chunk failed")
	assert.False(t, p.LateSettled(decode.Summary{Chunks: 32}, errors.New("room 3 not complete"), nil), "a room not complete")
	assert.False(t, p.LateSettled(decode.Summary{Chunks: 32}, nil, errors.New("drained")), "a run cut short proves nothing of its late chunks")
}
