package actors

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRestartWindow(t *testing.T) {
	w := &RestartWindow{Max: 2, Window: time.Second}
	t0 := time.Unix(1000, 0)
	assert.False(t, w.Add(t0))
	assert.False(t, w.Add(t0.Add(100*time.Millisecond)))
	assert.True(t, w.Add(t0.Add(200*time.Millisecond)), "3 restarts within 1 s is a storm")
	assert.True(t, w.Storm(t0.Add(900*time.Millisecond)))
	assert.False(t, w.Storm(t0.Add(1100*time.Millisecond)), "the first restart left the window")
	assert.False(t, w.Add(t0.Add(5*time.Second)), "calm again")
}
