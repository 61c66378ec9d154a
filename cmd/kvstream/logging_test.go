package main

import (
	"bytes"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestTerseLogsNoStackAboveDebug: an error at WARN is its message only; at
// DEBUG it keeps its cause chain and stack.
func TestTerseLogsNoStackAboveDebug(t *testing.T) {
	var buf bytes.Buffer
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(&buf), zap.DebugLevel)
	log := zap.New(terseCore{core})
	err := errors.Wrap(errors.New("no heartbeat answer"), "prefill lost")
	log.Warn("lost", zap.Error(err))
	assert.Contains(t, buf.String(), `"error":"prefill lost: no heartbeat answer"`)
	assert.NotContains(t, buf.String(), "errorVerbose")
	buf.Reset()
	log.Debug("lost", zap.Error(err))
	assert.Contains(t, buf.String(), "errorVerbose", "DEBUG keeps the stack")
	buf.Reset()
	log.With(zap.Error(err)).Warn("lost")
	assert.NotContains(t, buf.String(), "errorVerbose")
}
