package launch

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSayingNamesALongWait: a wait longer than waitSay is said (a
// "waiting" event naming it); a short one is not.
func TestSayingNamesALongWait(t *testing.T) {
	var b syncBuffer
	out := NewEmitter(&b)
	v, err := saying(out, "decode-0", "registration on etcd", func() (int, error) { return 7, nil })
	require.NoError(t, err)
	assert.Equal(t, 7, v)
	assert.Empty(t, b.String())

	release := make(chan struct{})
	go func() {
		// Released once the wait was said: the event is the evidence.
		for !strings.Contains(b.String(), `"event":"waiting"`) {
			time.Sleep(10 * time.Millisecond)
		}
		close(release)
	}()
	_, err = saying(out, "decode-0", "registration on etcd", func() (int, error) { <-release; return 0, nil })
	require.NoError(t, err)
	var got []Event
	require.NoError(t, ReadEvents(bytes.NewBufferString(b.String()), func(e Event) { got = append(got, e) }, nil))
	require.NotEmpty(t, got)
	assert.Equal(t, EventWaiting, got[0].Event)
	assert.Equal(t, "decode-0", got[0].ID)
	assert.Contains(t, got[0].What, "registration on etcd (1 s so far)")
}
