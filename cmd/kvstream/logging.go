package main

import (
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// cliLogger is the commands' logger: WARN and up, or DEBUG with verbose,
// to stderr. An error logged with zap.Error carries its whole cause chain
// and stack ("errorVerbose", about 2 KB a line for cockroachdb errors):
// useful when debugging, noise in an operator's log of expected events (a
// refused Hello, a lost peer), so it is kept at DEBUG only.
func cliLogger(verbose bool) *zap.Logger {
	level := zap.WarnLevel
	if verbose {
		level = zap.DebugLevel
	}
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.Lock(os.Stderr), level)
	return zap.New(terseCore{core})
}

// terseCore drops the "errorVerbose" of errors logged above DEBUG.
type terseCore struct{ zapcore.Core }

func (c terseCore) With(fields []zapcore.Field) zapcore.Core {
	return terseCore{c.Core.With(terse(zapcore.InfoLevel, fields))}
}

func (c terseCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c terseCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.Core.Write(e, terse(e.Level, fields))
}

// terse replaces, above DEBUG, each error field by its message alone.
func terse(level zapcore.Level, fields []zapcore.Field) []zapcore.Field {
	if level <= zapcore.DebugLevel {
		return fields
	}
	var out []zapcore.Field
	for i, f := range fields {
		if f.Type != zapcore.ErrorType {
			continue
		}
		if out == nil {
			out = append([]zapcore.Field(nil), fields...)
		}
		if err, ok := f.Interface.(error); ok && err != nil {
			out[i] = zap.String(f.Key, err.Error())
		}
	}
	if out == nil {
		return fields
	}
	return out
}
