package system

import (
	stderrors "errors"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
)

// TestEveryExportedSentinelIsStandard covers the classes the API tests
// cannot provoke cheaply (a lost device, a teardown that could not quiesce,
// a restart storm): an error carrying the mark the way the engine makes
// it, returned the way every exported function returns, is seen by the
// standard library's errors.Is, and by cockroachdb's.
func TestEveryExportedSentinelIsStandard(t *testing.T) {
	for name, sentinel := range map[string]error{
		"ErrBadInput": ErrBadInput, "ErrTimeout": ErrTimeout, "ErrEndpointBroken": ErrEndpointBroken,
		"ErrDeviceLost": ErrDeviceLost, "ErrEventWait": ErrEventWait, "ErrClosed": ErrClosed,
		"ErrNotQuiesced": ErrNotQuiesced, "ErrPeerLost": ErrPeerLost, "ErrUnhealthy": ErrUnhealthy,
		"ErrNoChunk": ErrNoChunk, "ErrDropped": ErrDropped, "ErrDecodeDraining": ErrDecodeDraining,
	} {
		err := public(errors.Wrap(errors.Mark(errors.New("room 1: something"), sentinel), "finish"))
		assert.True(t, stderrors.Is(err, sentinel), name)
		assert.True(t, errors.Is(err, sentinel), name)
		assert.False(t, stderrors.Is(err, stderrors.New("another")), name)
	}
}
