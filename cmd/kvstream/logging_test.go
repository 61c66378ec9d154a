package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/system"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestLogOptions: --log-format and --log-level choose the logger; --verbose
// is --log-level debug; a bad value names the flag, the value and the
// choices.
func TestLogOptions(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		verbose bool
		want    logOptions
		err     string
	}{
		{nil, false, logOptions{level: zapcore.WarnLevel}, ""},
		{nil, true, logOptions{level: zapcore.DebugLevel}, ""},
		{[]string{"--log-format", "json", "--log-level", "info"}, false, logOptions{json: true, level: zapcore.InfoLevel}, ""},
		{[]string{"--log-level", "error"}, false, logOptions{level: zapcore.ErrorLevel}, ""},
		{[]string{"--log-level", "debug"}, true, logOptions{level: zapcore.DebugLevel}, ""},
		{[]string{"--log-format", "xml"}, false, logOptions{}, `--log-format "xml": want console or json`},
		{[]string{"--log-level", "loud"}, false, logOptions{}, `--log-level "loud": want debug, info, warn, error`},
		{[]string{"--log-level", "WARN"}, false, logOptions{}, `--log-level "WARN": want debug, info, warn, error`},
		{[]string{"--log-level", "error"}, true, logOptions{}, "--verbose and --log-level error: --verbose is --log-level debug, give one"},
	} {
		fl := pflag.NewFlagSet("t", pflag.ContinueOnError)
		addLogFlags(fl)
		require.NoError(t, fl.Parse(tc.args))
		got, err := parseLogOptions(fl, tc.verbose)
		if tc.err != "" {
			assert.EqualError(t, err, tc.err, "%v", tc.args)
			continue
		}
		require.NoError(t, err, "%v", tc.args)
		assert.Equal(t, tc.want, got, "%v", tc.args)
	}
}

// TestJSONLogs: --log-format json writes one JSON object a line, with the
// level, the message and the fields, and still no stack above DEBUG.
func TestJSONLogs(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(&buf, logOptions{json: true, level: zapcore.InfoLevel})
	log.Debug("not shown")
	log.Info("decode session opened", zap.String("server", "127.0.0.1:9100/kvstream-decode"))
	log.Warn("prefill lost", zap.Error(errors.New("no heartbeat answer")))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, buf.String())
	var first, second map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &second))
	assert.Equal(t, "info", first["level"])
	assert.Equal(t, "decode session opened", first["msg"])
	assert.Equal(t, "127.0.0.1:9100/kvstream-decode", first["server"])
	assert.NotEmpty(t, first["ts"])
	assert.Equal(t, "warn", second["level"])
	assert.Equal(t, "no heartbeat answer", second["error"])
	assert.NotContains(t, second, "errorVerbose")
}

// TestCommandsRefuseBadLogFlagsAndEnvironment: every command takes the
// logging flags and refuses a bad one before any work; a malformed
// environment variable of the engine fails a command that runs one at
// once, naming the variable and its value, even where a flag sets the same
// knob (sim's --group).
func TestCommandsRefuseBadLogFlagsAndEnvironment(t *testing.T) {
	for _, cmd := range [][]string{{"sim"}, {"generate"}, {"prefill"}, {"decode"}, {"up"}, {"decode-instance"}, {"prefill-rank"},
		{"soak"}, {"replay", "x"}, {"bench", "host"}, {"certs", "x"}, {"version"}} {
		_, err := run(t, append(cmd, "--log-level", "verbose")...)
		assert.EqualError(t, err, `--log-level "verbose": want debug, info, warn, error`, "%v", cmd)
		_, err = run(t, append(cmd, "--log-format", "text")...)
		assert.EqualError(t, err, `--log-format "text": want console or json`, "%v", cmd)
	}
	for _, tc := range []struct{ name, value, want string }{
		{system.EnvGroupSize, "abc", `KVSTREAM_GROUP_SIZE="abc": want a positive integer`},
		{system.EnvFinishTimeout, "-5", `KVSTREAM_FINISH_TIMEOUT="-5": want a positive duration such as 30s`},
		{system.EnvSubmitters, "0", `KVSTREAM_SUBMITTERS="0": want a positive integer`},
		{system.EnvPerLayer, "perhaps", `KVSTREAM_PER_LAYER="perhaps": want 1/0 or true/false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			for _, cmd := range [][]string{append(slices.Clone(quick), "--group", "4"), {"prefill"}, {"decode"}, {"up"}, {"generate"}} {
				_, err := run(t, cmd...)
				assert.EqualError(t, err, tc.want, "%v", cmd[0])
			}
			out, err := run(t, "version")
			require.NoError(t, err, "version runs no engine")
			assert.Contains(t, out, "protocol: ")
		})
	}
}
