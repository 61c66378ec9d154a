package simsession

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestBytesVerdict: a prefill says "bytes equal: false" only when the
// decode process refused or found different a chunk it was told of; a run
// that was cut or lost its decode says the comparison was not made for
// every chunk.
func TestBytesVerdict(t *testing.T) {
	assert.Equal(t, "bytes equal: true", bytesVerdict{equal: true}.String())
	assert.Equal(t, "bytes equal: false", bytesVerdict{differ: "room 3: page 7 differs"}.String())
	assert.Equal(t, "bytes equal: not compared for every chunk (none compared differed)", bytesVerdict{}.String())
}
