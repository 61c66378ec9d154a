package launch

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCommand(t *testing.T) {
	c, err := ParseCommand("run 12 decode-3")
	require.NoError(t, err)
	assert.Equal(t, Command{Batch: 12, Decode: "decode-3"}, c)
	assert.Equal(t, "run 12 decode-3", c.String())
	for line, want := range map[string]string{
		"":                  "want",
		"run 1":             "want",
		"stop 1 decode-0":   "want",
		"run x decode-0":    `batch "x"`,
		"run -1 decode-0":   `batch "-1"`,
		"run 01 decode-0":   `batch "01"`,
		"run 1 ../decode-0": "../decode-0",
		"run 1 a b":         "want",
	} {
		_, err := ParseCommand(line)
		assert.ErrorContains(t, err, want, "%q", line)
	}
}

// TestEventsRoundTrip: what a node emits is what the launcher reads, line
// by line; a line that is no event goes to other.
func TestEventsRoundTrip(t *testing.T) {
	var b bytes.Buffer
	out := NewEmitter(&b)
	sent := []Event{
		{Event: EventReady, ID: "decode-0", Addr: "127.0.0.1:9", Pid: 7, Metrics: "127.0.0.1:8"},
		{Event: EventRoom, ID: "decode-0", Batch: 2, Room: 1, Complete: true},
		{Event: EventNode, ID: "decode-0", Row: &Row{ID: "decode-0", Role: "decode", PagesVerified: 9, Drained: true}},
	}
	for _, e := range sent {
		out.Emit(e)
	}
	b.WriteString("panic: not a JSON line\n{\"no\":\"event\"}\n")
	var got []Event
	var other []string
	require.NoError(t, ReadEvents(&b, func(e Event) { got = append(got, e) }, func(s string) { other = append(other, s) }))
	assert.Equal(t, sent, got)
	assert.Equal(t, []string{"panic: not a JSON line", `{"no":"event"}`}, other)
	require.Error(t, ReadEvents(strings.NewReader(strings.Repeat("x", maxEventLine+1)), func(Event) {}, nil), "a line over the bound")
}
