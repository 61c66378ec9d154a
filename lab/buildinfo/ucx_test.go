//go:build ucx

package buildinfo

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestReadUCX: a ucx build says which UCX it was built with and runs with.
func TestReadUCX(t *testing.T) {
	in := Read()
	assert.Regexp(t, `^\d+\.\d+$`, in.UCXBuilt)
	assert.Regexp(t, `^\d+\.\d+\.\d+$`, in.UCXRuntime)
	assert.Contains(t, in.String(), "ucx:      built with "+in.UCXBuilt+", running with "+in.UCXRuntime)
}
