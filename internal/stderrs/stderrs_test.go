package stderrs

import (
	stderrors "errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

var (
	errClass = errors.New("class")
	errOther = errors.New("other")
)

func TestPublicMakesMarksVisibleToTheStandardLibrary(t *testing.T) {
	marked := errors.Mark(errors.Wrap(errors.WithDetail(errors.New("room 3: page 9 out of range"), "pool of 8 pages"), "expect"), errClass)
	require.False(t, stderrors.Is(marked, errClass), "precondition: the standard library cannot see a mark")
	pub := Public(marked)

	assert.True(t, stderrors.Is(pub, errClass))
	assert.True(t, stderrors.Is(fmt.Errorf("caller: %w", pub), errClass), "wrapped again by the caller")
	assert.False(t, stderrors.Is(pub, errOther))
	assert.True(t, errors.Is(pub, errClass), "cockroachdb's Is still answers")
	assert.False(t, errors.Is(pub, errOther))

	assert.Equal(t, marked.Error(), pub.Error())
	assert.Equal(t, fmt.Sprintf("%v", marked), fmt.Sprintf("%v", pub))
	verbose := fmt.Sprintf("%+v", pub)
	for _, want := range []string{"room 3: page 9 out of range", "pool of 8 pages", "attached stack trace", "stderrs_test.go"} {
		assert.Contains(t, verbose, want, "cockroachdb's verbose format still shows the cause's details")
	}
	assert.Equal(t, errors.GetAllDetails(marked), errors.GetAllDetails(pub))
	assert.Same(t, pub, Public(pub), "wrapping twice is a no-op")
	assert.NoError(t, Public(nil))
}

// TestWarnFieldIsTheMessage: a WARN line carries the error's message under
// "error" and nothing of its stack (zap.Error of a cockroachdb error would
// add errorVerbose); a nil error adds no field.
func TestWarnFieldIsTheMessage(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	err := errors.Wrap(errors.New("connection reset"), "room 7 chunk 0")
	zap.New(core).Warn("chunk transfer failed", WarnField(err), WarnField(nil))
	require.Equal(t, 1, logs.Len())
	fields := logs.All()[0].ContextMap()
	require.Equal(t, map[string]any{"error": "room 7 chunk 0: connection reset"}, fields)

	// What it replaces: zap.Error writes the stack too.
	zap.New(core).Warn("the same with zap.Error", zap.Error(err))
	require.Contains(t, logs.All()[1].ContextMap(), "errorVerbose")
}
