package trace

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/messages"
)

// Encode turns a message or an effect into plain JSON-able data. Runtime
// objects are reduced to what identifies them across a record and a replay:
// an event becomes "ev:<address>" (the same event shared by several chunks
// keeps one name), a value with a TraceName method that name (a chunk's job:
// its chunk), an error its text, times Unix nanoseconds; PIDs, props,
// channels and contexts are left out (they are addresses, not meaning), and so
// are fields tagged trace:"-" (measurements that decide nothing) and, when
// zero, fields tagged trace:"omitempty" (a field added later: recordings
// made before it read the same).
func Encode(v any) any {
	return encodeValue(reflect.ValueOf(v))
}

var (
	eventType    = reflect.TypeOf((*messages.Event)(nil)).Elem()
	namedType    = reflect.TypeOf((*interface{ TraceName() string })(nil)).Elem()
	errorType    = reflect.TypeOf((*error)(nil)).Elem()
	timeType     = reflect.TypeOf(time.Time{})
	durationType = reflect.TypeOf(time.Duration(0))
	pidType      = reflect.TypeOf((*actor.PID)(nil))
	propsType    = reflect.TypeOf((*actor.Props)(nil))
	anyType      = reflect.TypeOf((*any)(nil)).Elem()
	stringerType = reflect.TypeOf((*fmt.Stringer)(nil)).Elem()
)

func skipped(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Chan, reflect.Func, reflect.Map, reflect.UnsafePointer:
		return true
	}
	return t == pidType || t == propsType || t.Implements(reflect.TypeOf((*interface{ Deadline() (time.Time, bool) })(nil)).Elem())
}

func encodeValue(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	t := v.Type()
	switch {
	case t == timeType:
		tm := v.Interface().(time.Time)
		if tm.IsZero() {
			return 0
		}
		return tm.UnixNano()
	case t == durationType:
		return v.Int()
	}
	if t.Kind() != reflect.Interface && t.Implements(namedType) {
		if t.Kind() == reflect.Pointer && v.IsNil() {
			return nil
		}
		return v.Interface().(interface{ TraceName() string }).TraceName()
	}
	if t.Kind() == reflect.Int && t.Implements(stringerType) {
		return v.Interface().(fmt.Stringer).String() // statuses, modes: readable
	}
	switch t.Kind() {
	case reflect.Interface:
		if v.IsNil() {
			return nil
		}
		switch {
		case t == errorType:
			return v.Interface().(error).Error()
		case t == eventType:
			return EventName(v.Interface())
		case t == anyType:
			return Typed(v.Interface())
		}
		return encodeValue(v.Elem())
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		return encodeValue(v.Elem())
	case reflect.Struct:
		if c, ok := v.Interface().(messages.Chunk); ok {
			return ChunkID(c)
		}
		out := make(map[string]any, t.NumField())
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() || skipped(f.Type) || f.Tag.Get("trace") == "-" ||
				f.Tag.Get("trace") == "omitempty" && v.Field(i).IsZero() {
				continue
			}
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				if inner, ok := encodeValue(v.Field(i)).(map[string]any); ok {
					for k, x := range inner {
						out[k] = x
					}
				}
				continue
			}
			out[f.Name] = encodeValue(v.Field(i))
		}
		return out
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && v.IsNil() {
			return nil
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = encodeValue(v.Index(i))
		}
		return out
	case reflect.Bool:
		return v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return v.Uint()
	case reflect.Float32, reflect.Float64:
		return v.Float()
	case reflect.String:
		return v.String()
	}
	return nil
}

// Typed encodes a value with its type name: {"type": "GroupReady", "msg": {...}}.
func Typed(v any) map[string]any {
	return map[string]any{"type": TypeName(v), "msg": Encode(v)}
}

// TypeName is a message's or effect's type without package or pointer.
func TypeName(v any) string {
	t := reflect.TypeOf(v)
	if t == nil {
		return "nil"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

// EventName identifies an event by its address; events are shared by
// pointer, so every chunk of a forward names the group's event the same.
func EventName(ev any) string {
	if ev == nil {
		return ""
	}
	if n, ok := ev.(interface{ TraceName() string }); ok {
		return n.TraceName()
	}
	return fmt.Sprintf("ev:%p", ev)
}

// ChunkID is a chunk's name in traces: room:start-end#serial (plus @epoch
// for an empty range).
func ChunkID(c messages.Chunk) string {
	s := strconv.FormatUint(c.Room, 10) + ":" + strconv.Itoa(c.Start) + "-" + strconv.Itoa(c.End)
	if c.Epoch != 0 {
		s += "@" + strconv.FormatUint(c.Epoch, 10)
	}
	return s + "#" + strconv.FormatUint(c.Serial, 10)
}

// Effect renders an effect as one comparable line: its type and fields.
func Effect(e any) string {
	b, err := json.Marshal(Encode(e))
	if err != nil {
		return TypeName(e) + " <unencodable: " + err.Error() + ">"
	}
	return TypeName(e) + " " + string(b)
}
