package core

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// TestClip: a text is cut to its bound at a character boundary, so that
// the message carrying it can still be marshaled.
func TestClip(t *testing.T) {
	assert.Equal(t, "abc", Clip("abc", 3))
	assert.Equal(t, "ab", Clip("abc", 2))
	assert.Equal(t, "", Clip("abc", 0))
	// "取" is 3 bytes: a bound inside it keeps the characters before it.
	assert.Equal(t, "取", Clip("取消", 4))
	assert.Equal(t, "取", Clip("取消", 5))
	assert.Equal(t, "取消", Clip("取消", 6))
	assert.Equal(t, "", Clip("取消", 2))
	for n := range 20 {
		s := Clip("a取消é\U0001F600z", n)
		assert.True(t, utf8.ValidString(s), "cut at %d: %q", n, s)
		assert.LessOrEqual(t, len(s), n)
	}
}
