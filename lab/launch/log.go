package launch

import "go.uber.org/zap"

// warnErr is an error for a WARN line: its message only, no stack trace
// (zap.Error of a cockroachdb error adds one, about 2 KB, which an
// expected event does not need). DEBUG lines use zap.Error.
func warnErr(err error) zap.Field {
	if err == nil {
		return zap.Skip()
	}
	return zap.String("error", err.Error())
}
