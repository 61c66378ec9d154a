package reshard

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// EvenStages by hand: 61 layers in 2 stages are 30 and 31, in 4 stages 15,
// 15, 15 and 16; one stage is nil; more stages than layers leave one empty.
func TestEvenStagesByHand(t *testing.T) {
	assert.Equal(t, []int{0, 30, 61}, EvenStages(61, 2))
	assert.Equal(t, []int{0, 15, 30, 45, 61}, EvenStages(61, 4))
	assert.Nil(t, EvenStages(61, 1))
	assert.Nil(t, EvenStages(61, 0))
	assert.Equal(t, []int{0, 0, 1, 2}, EvenStages(2, 3))
}
