package launch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvstream/kvstream/lab/service"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A node's stdin: a prefill rank gets its command lines in order, and the
// end of stdin drains a node, whether it takes commands or not.
func TestStdin(t *testing.T) {
	sd := service.OnSignals()
	defer sd.Stop()
	var got []string
	for l := range ReadCommands(strings.NewReader("run 0 decode-0\nrun 1 decode-1\n"), sd) {
		got = append(got, l)
	}
	assert.Equal(t, []string{"run 0 decode-0", "run 1 decode-1"}, got)
	<-sd.Draining()
	assert.Equal(t, "stdin closed", sd.Reason())

	quiet := service.OnSignals()
	defer quiet.Stop()
	DrainAtEOF(strings.NewReader("ignored\n"), quiet)
	select {
	case <-quiet.Draining():
	case <-time.After(10 * time.Second):
		require.Fail(t, "the end of stdin did not drain the node")
	}
	assert.Equal(t, "stdin closed", context.Cause(quiet.Context()).Error())
}
