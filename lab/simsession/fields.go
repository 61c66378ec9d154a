package simsession

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/system"
)

// field is one name=value field of a session metadata value (ShardKey,
// TinyKey) and how its value is read: set stores it, or says what is wrong
// with it, naming the field.
type field struct {
	name string
	set  func(value string) error
}

// parseFields reads text, the value of the session metadata key key, which
// comes from the network: at most maxLen bytes of space-separated
// name=value fields, every one of fields exactly once, nothing else. Each
// value goes to its field's set as it is read; the first fault is
// returned, marked system.ErrBadInput and prefixed with the key and the
// text.
func parseFields(key, text string, maxLen int, fields []field) error {
	bad := func(format string, args ...any) error {
		return errors.Mark(errors.Newf("%s %.64q: "+format, append([]any{key, text}, args...)...), system.ErrBadInput)
	}
	if len(text) > maxLen {
		return bad("longer than %d bytes", maxLen)
	}
	seen := map[string]bool{}
	for _, f := range strings.Fields(text) {
		name, value, ok := strings.Cut(f, "=")
		if !ok {
			return bad("field %.32q is not name=value", f)
		}
		if seen[name] {
			return bad("field %.32q given twice", name)
		}
		seen[name] = true
		i := slices.IndexFunc(fields, func(f field) bool { return f.name == name })
		if i < 0 {
			return bad("unknown field %.32q", name)
		}
		if err := fields[i].set(value); err != nil {
			return bad("%s", err.Error())
		}
	}
	if len(seen) != len(fields) {
		var missing []string
		for _, f := range fields {
			if !seen[f.name] {
				missing = append(missing, f.name)
			}
		}
		return bad("missing %s", strings.Join(missing, ", "))
	}
	return nil
}

// textField is a field whose value is taken as it is.
func textField(name string, dst *string) field {
	return field{name, func(v string) error { *dst = v; return nil }}
}

// intField is a field whose value is a number from 0 to math.MaxInt32.
func intField(name string, dst *int) field {
	return field{name, func(v string) error {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			return errors.Newf("%s %.32q: want a number from 0 to %d", name, v, int32(math.MaxInt32))
		}
		*dst = int(n)
		return nil
	}}
}

// orderField is the page-order field: a reshard.Order by its name.
func orderField(dst *reshard.Order) field {
	return field{"page-order", func(v string) error {
		switch v {
		case reshard.HeadMajor.String():
			*dst = reshard.HeadMajor
		case reshard.TokenMajor.String():
			*dst = reshard.TokenMajor
		default:
			return errors.Newf("page-order %.32q: want %s or %s", v, reshard.HeadMajor, reshard.TokenMajor)
		}
		return nil
	}}
}
