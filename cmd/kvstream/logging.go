package main

import (
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The logging flags every command takes (the root's persistent flags).
const (
	flagLogFormat = "log-format"
	flagLogLevel  = "log-level"
)

var (
	logFormats = []string{"console", "json"}
	logLevels  = []string{"debug", "info", "warn", "error"}
)

// addLogFlags declares --log-format and --log-level on the root, for every
// command.
func addLogFlags(fl *pflag.FlagSet) {
	fl.String(flagLogFormat, "console", "log format: "+strings.Join(logFormats, " or ")+" (one object a line, to ship)")
	fl.String(flagLogLevel, "warn", "least level logged: "+strings.Join(logLevels, ", ")+" (info: a line per session opened and ended and per drain)")
}

// logOptions are what the logging flags ask for.
type logOptions struct {
	json  bool
	level zapcore.Level
}

// parseLogOptions reads and checks the logging flags of fl; verbose
// (a command's --verbose) is --log-level debug.
func parseLogOptions(fl *pflag.FlagSet, verbose bool) (logOptions, error) {
	var o logOptions
	format, level := "console", "warn"
	if f := fl.Lookup(flagLogFormat); f != nil {
		format = f.Value.String()
	}
	if f := fl.Lookup(flagLogLevel); f != nil {
		level = f.Value.String()
		if verbose && f.Changed && level != "debug" {
			return o, errors.Newf("--verbose and --%s %s: --verbose is --%s debug, give one", flagLogLevel, level, flagLogLevel)
		}
	}
	if !slices.Contains(logFormats, format) {
		return o, errors.Newf("--%s %q: want %s", flagLogFormat, format, strings.Join(logFormats, " or "))
	}
	if !slices.Contains(logLevels, level) {
		return o, errors.Newf("--%s %q: want %s", flagLogLevel, level, strings.Join(logLevels, ", "))
	}
	if verbose {
		level = "debug"
	}
	o.json = format == "json"
	if err := o.level.Set(level); err != nil {
		return o, errors.Wrapf(err, "--%s %q", flagLogLevel, level)
	}
	return o, nil
}

// checkLogFlags refuses bad logging flags before a command runs.
func checkLogFlags(cmd *cobra.Command) error {
	verbose := false
	if f := cmd.Flags().Lookup("verbose"); f != nil {
		verbose = f.Value.String() == "true"
	}
	_, err := parseLogOptions(cmd.Flags(), verbose)
	return err
}

// logArgs passes the logging flags given to cmd on to the processes it
// starts (kvstream up's nodes).
func logArgs(cmd *cobra.Command) []string {
	var out []string
	for _, name := range []string{flagLogFormat, flagLogLevel} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			out = append(out, "--"+name, f.Value.String())
		}
	}
	return out
}

// cliLogger is the commands' logger, to stderr: the level and format of
// --log-level (WARN by default; DEBUG with verbose) and --log-format, which
// the root checked before the command ran. An error logged with zap.Error
// carries its whole cause chain and stack ("errorVerbose", about 2 KB a
// line for cockroachdb errors): useful when debugging, noise in an
// operator's log of expected events (a refused Hello, a lost peer), so it
// is kept at DEBUG only.
func cliLogger(cmd *cobra.Command, verbose bool) *zap.Logger {
	o, err := parseLogOptions(cmd.Flags(), verbose)
	if err != nil {
		o = logOptions{level: zapcore.WarnLevel} // checked before the command ran
		if verbose {
			o.level = zapcore.DebugLevel
		}
	}
	return newLogger(os.Stderr, o)
}

func newLogger(w io.Writer, o logOptions) *zap.Logger {
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	if o.json {
		ec := zap.NewProductionEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		enc = zapcore.NewJSONEncoder(ec)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), o.level)
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
