package main

import (
	"fmt"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/buildinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVersion: `kvstream version` and `kvstream --version` print the same
// lines: the module version, the commit, the Go release, the UCX versions
// and the control protocol version.
func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	require.NoError(t, err)
	in := buildinfo.Read()
	assert.Equal(t, in.String(), out)
	for _, want := range []string{"kvstream " + in.Version + "\n", "commit:   ", "go:       go", "ucx:      "} {
		assert.Contains(t, out, want)
	}
	assert.Contains(t, out, fmt.Sprintf("protocol: %d\n", decode.ProtocolVersion))
	flag, err := run(t, "--version")
	require.NoError(t, err)
	assert.Equal(t, out, flag)
	_, err = run(t, "version", "extra")
	assert.Error(t, err)
}
