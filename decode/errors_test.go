package decode

import (
	stderrors "errors"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
)

// TestEveryExportedSentinelIsStandard: an error carrying any of the
// package's classes, returned the way every exported function returns, is
// seen by the standard library's errors.Is and by cockroachdb's. The API
// tests provoke each class through the package with the standard library.
func TestEveryExportedSentinelIsStandard(t *testing.T) {
	for name, sentinel := range map[string]error{
		"ErrBadInput": ErrBadInput, "ErrVersion": ErrVersion, "ErrChunkFailed": ErrChunkFailed,
		"ErrPrefillLost": ErrPrefillLost, "ErrDecodeLost": ErrDecodeLost, "ErrSessionAborted": ErrSessionAborted,
		"ErrNotQuiesced": ErrNotQuiesced, "ErrClosed": ErrClosed, "ErrRefused": ErrRefused,
	} {
		err := public(errors.Wrap(errors.Mark(errors.New("room 1"), sentinel), "wait"))
		assert.True(t, stderrors.Is(err, sentinel), name)
		assert.True(t, errors.Is(err, sentinel), name)
		assert.False(t, stderrors.Is(err, stderrors.New("another")), name)
	}
}

// TestMetricsWithoutRegistry: a nil registerer is metrics off, not a panic.
func TestMetricsWithoutRegistry(t *testing.T) {
	m, err := NewMetrics(nil)
	if err != nil || m == nil {
		t.Fatalf("NewMetrics(nil) = %v, %v", m, err)
	}
	m.SessionEnded("complete")
}
