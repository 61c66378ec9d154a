package core

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"

	"github.com/cockroachdb/errors"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The core's vocabulary as a trace holds it (package decode records every
// message its Server steps the core with, and the effects it returned; its
// replay steps a fresh core with the messages read back). A message is
// encoded by its fields' Go names, so that it decodes back exactly: a
// protobuf message by its exported fields (its proto fields; fields this
// version of the protocol does not know, a newer peer's, are left out: the
// core reads none), its enums by name; bytes in base64; an error as its text and the classes it is marked
// with, all that the core and the serving stack read of it. A field of an
// interface type other than error (a buffer's registration, Buffer.Region)
// is left out: it is the shell's, and the core reads nothing of it.

// msgTypes are the messages a trace holds, by MsgType.
var msgTypes = func() map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for _, msg := range []Msg{HelloMsg{}, NoticeMsg{}, ByeMsg{}, DepartedMsg{}, PeerLostMsg{}, RevokedMsg{}, TimerMsg{},
		ExpectMsg{}, ReleaseMsg{}, DisconnectMsg{}, LookupMsg{}, DrainMsg{}, CloseMsg{}, StateMsg{}, CancelMsg{}, CancelRoomMsg{},
		AdmittedMsg{}, SizedMsg{}, AccessMsg{}, VerifiedMsg{}} {
		t := reflect.TypeOf(msg)
		m[t.Name()] = t
	}
	return m
}()

// MsgType names a message in a trace: its Go type's name (HelloMsg, ...).
func MsgType(m Msg) string { return reflect.TypeOf(m).Name() }

type errorClass struct {
	name string
	mark error
}

// errorClasses are the marks an error keeps through a trace: the classes
// the core tests (errors.Is) and the serving stack branches on.
var errorClasses = []errorClass{
	{"ErrBadInput", ErrBadInput}, {"ErrChunkFailed", ErrChunkFailed}, {"ErrPrefillLost", ErrPrefillLost},
	{"ErrSessionAborted", ErrSessionAborted}, {"ErrNotQuiesced", ErrNotQuiesced}, {"ErrClosed", ErrClosed},
	{"ErrCancelled", ErrCancelled},
}

var (
	errorType = reflect.TypeFor[error]()
	anyType   = reflect.TypeFor[any]()
	enumType  = reflect.TypeFor[protoreflect.Enum]()
)

// EncodeMsg returns a message as JSON-able data (see the top of this
// file): what DecodeMsg reads back.
func EncodeMsg(m Msg) any { return encoder{}.value(reflect.ValueOf(m)) }

// EffectLines renders effects as comparable lines: an effect's type and
// its fields as JSON, as EncodeMsg encodes them but with every enum (and
// duration) by name, for people to read; a replay compares them as text.
func EffectLines(effs []Effect) []string {
	if len(effs) == 0 {
		return nil
	}
	out := make([]string, len(effs))
	for i, e := range effs {
		name := reflect.TypeOf(e).Name()
		b, err := json.Marshal(encoder{names: true}.value(reflect.ValueOf(e)))
		if err != nil {
			out[i] = name + " <unencodable: " + err.Error() + ">"
			continue
		}
		out[i] = name + " " + string(b)
	}
	return out
}

// encoder turns the vocabulary's values into JSON-able data; names: every
// integer type with a String method (not only protobuf enums) by its name.
type encoder struct{ names bool }

func (e encoder) value(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	t := v.Type()
	switch t.Kind() {
	case reflect.Interface:
		if v.IsNil() {
			return nil
		}
		if err, ok := v.Interface().(error); ok {
			return encodeError(err)
		}
		return e.value(v.Elem())
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		return e.value(v.Elem())
	case reflect.Struct:
		out := make(map[string]any, t.NumField())
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() || skippedField(f) {
				continue
			}
			out[f.Name] = e.value(v.Field(i))
		}
		return out
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		if t.Elem().Kind() == reflect.Uint8 {
			return base64.StdEncoding.EncodeToString(v.Bytes())
		}
		fallthrough
	case reflect.Array:
		out := make([]any, v.Len())
		for i := range out {
			out[i] = e.value(v.Index(i))
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		out := make(map[string]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			out[fmt.Sprint(it.Key().Interface())] = e.value(it.Value())
		}
		return out
	case reflect.Bool:
		return v.Bool()
	case reflect.String:
		return v.String()
	case reflect.Float32, reflect.Float64:
		return v.Float()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if t.Implements(enumType) || e.names && t.Implements(reflect.TypeFor[fmt.Stringer]()) {
			return v.Interface().(fmt.Stringer).String()
		}
		if v.CanInt() {
			return v.Int()
		}
		return v.Uint()
	}
	return fmt.Sprintf("<%s>", t) // a kind the vocabulary does not use
}

// skippedField says whether a field stays out of a trace: one of an
// interface type other than error and any (the shell's runtime objects).
func skippedField(f reflect.StructField) bool {
	return f.Type.Kind() == reflect.Interface && f.Type != errorType && f.Type != anyType
}

// encodeError is an error as a trace holds it.
func encodeError(err error) map[string]any {
	out := map[string]any{"Text": err.Error()}
	var marks []any
	for _, c := range errorClasses {
		if errors.Is(err, c.mark) {
			marks = append(marks, c.name)
		}
	}
	if marks != nil {
		out["Marks"] = marks
	}
	return out
}

// DecodeMsg rebuilds a message of type typ from its encoding as read from a
// trace (JSON decoded with numbers as json.Number, or EncodeMsg's own
// data). A trace is hostile input: an unknown type, an unknown field, a
// value of the wrong kind or out of its field's range is an error that
// names the field.
func DecodeMsg(typ string, data any) (Msg, error) {
	t, ok := msgTypes[typ]
	if !ok {
		return nil, errors.Newf("type %q: not a message of the decode core", excerpt(typ))
	}
	v := reflect.New(t).Elem()
	if err := decodeInto(typ, data, v); err != nil {
		return nil, err
	}
	return v.Interface().(Msg), nil
}

func excerpt(s string) string {
	if len(s) > 64 {
		return s[:64] + "… (" + strconv.Itoa(len(s)) + " bytes)"
	}
	return s
}

// decodeInto sets v (settable, its zero value) from data; path names v in
// errors.
func decodeInto(path string, data any, v reflect.Value) error {
	t := v.Type()
	wrong := func(want string) error {
		return errors.Newf("%s: %s, want %s", path, kindOf(data), want)
	}
	if t == errorType {
		if data == nil {
			return nil
		}
		return decodeError(path, data, v)
	}
	switch t.Kind() {
	case reflect.Pointer:
		if data == nil {
			return nil
		}
		p := reflect.New(t.Elem())
		if err := decodeInto(path, data, p.Elem()); err != nil {
			return err
		}
		v.Set(p)
	case reflect.Struct:
		fields, ok := data.(map[string]any)
		if !ok {
			return wrong("an object")
		}
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			f, ok := t.FieldByName(k)
			if !ok || !f.IsExported() || skippedField(f) || len(f.Index) != 1 {
				return errors.Newf("%s: no field %q", path, excerpt(k))
			}
			if err := decodeInto(path+"."+k, fields[k], v.Field(f.Index[0])); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if data == nil {
			return nil
		}
		if t.Elem().Kind() == reflect.Uint8 {
			s, ok := data.(string)
			if !ok {
				return wrong("base64 text")
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return errors.Wrapf(err, "%s", path)
			}
			v.SetBytes(b)
			return nil
		}
		list, ok := data.([]any)
		if !ok {
			return wrong("an array")
		}
		s := reflect.MakeSlice(t, len(list), len(list))
		for i, x := range list {
			if err := decodeInto(path+"["+strconv.Itoa(i)+"]", x, s.Index(i)); err != nil {
				return err
			}
		}
		v.Set(s)
	case reflect.Map:
		if data == nil {
			return nil
		}
		fields, ok := data.(map[string]any)
		if !ok || t.Key().Kind() != reflect.String {
			return wrong("an object")
		}
		m := reflect.MakeMapWithSize(t, len(fields))
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			x := reflect.New(t.Elem()).Elem()
			if err := decodeInto(path+"["+strconv.Quote(excerpt(k))+"]", fields[k], x); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), x)
		}
		v.Set(m)
	case reflect.String:
		s, ok := data.(string)
		if !ok {
			return wrong("text")
		}
		v.SetString(s)
	case reflect.Bool:
		b, ok := data.(bool)
		if !ok {
			return wrong("true or false")
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if name, ok := data.(string); ok && t.Implements(enumType) {
			return decodeEnum(path, name, v)
		}
		n, err := integer(data)
		if err != nil || !n.signed || v.OverflowInt(n.i) {
			return errors.Newf("%s: %s, want an integer of %s", path, kindOf(data), t)
		}
		v.SetInt(n.i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := integer(data)
		if err != nil || n.negative || v.OverflowUint(n.u) {
			return errors.Newf("%s: %s, want an integer of %s", path, kindOf(data), t)
		}
		v.SetUint(n.u)
	case reflect.Float32, reflect.Float64:
		f, err := float(data)
		if err != nil || v.OverflowFloat(f) {
			return errors.Newf("%s: %s, want a number", path, kindOf(data))
		}
		v.SetFloat(f)
	default:
		return errors.Newf("%s: a %s cannot be read from a trace", path, t)
	}
	return nil
}

// decodeError sets v (an error) from its text, marked with its classes.
func decodeError(path string, data any, v reflect.Value) error {
	fields, ok := data.(map[string]any)
	if !ok {
		return errors.Newf("%s: %s, want an error ({\"Text\": ..., \"Marks\": [...]})", path, kindOf(data))
	}
	text, ok := fields["Text"].(string)
	if !ok {
		return errors.Newf("%s.Text: %s, want text", path, kindOf(fields["Text"]))
	}
	for k := range fields {
		if k != "Text" && k != "Marks" {
			return errors.Newf("%s: no field %q in an error", path, excerpt(k))
		}
	}
	err := errors.New(text)
	if m, ok := fields["Marks"]; ok {
		list, ok := m.([]any)
		if !ok {
			return errors.Newf("%s.Marks: %s, want an array", path, kindOf(m))
		}
		for i, x := range list {
			name, _ := x.(string)
			at := slices.IndexFunc(errorClasses, func(c errorClass) bool { return c.name == name })
			if at < 0 {
				return errors.Newf("%s.Marks[%d]: %s: not a class of the decode core's errors", path, i, kindOf(x))
			}
			err = errors.Mark(err, errorClasses[at].mark)
		}
	}
	v.Set(reflect.ValueOf(&err).Elem())
	return nil
}

// decodeEnum sets a protobuf enum from its name (or its number as text:
// the name of a value the enum does not know).
func decodeEnum(path, name string, v reflect.Value) error {
	e := reflect.Zero(v.Type()).Interface().(protoreflect.Enum)
	if ev := e.Descriptor().Values().ByName(protoreflect.Name(name)); ev != nil {
		v.SetInt(int64(ev.Number()))
		return nil
	}
	n, err := strconv.ParseInt(name, 10, 32)
	if err != nil || v.OverflowInt(n) {
		return errors.Newf("%s: %q is not a value of %s", path, excerpt(name), v.Type())
	}
	v.SetInt(n)
	return nil
}

// number is an integer read from a trace.
type number struct {
	i        int64
	u        uint64
	signed   bool // fits an int64
	negative bool
}

// integer reads an integer: a json.Number, an integer EncodeMsg wrote, or
// a float64 that holds one exactly.
func integer(data any) (number, error) {
	switch x := data.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return number{i: i, u: uint64(i), signed: true, negative: i < 0}, nil
		}
		u, err := strconv.ParseUint(string(x), 10, 64)
		if err != nil {
			return number{}, err
		}
		return number{u: u}, nil
	case int64:
		return number{i: x, u: uint64(x), signed: true, negative: x < 0}, nil
	case int:
		return number{i: int64(x), u: uint64(x), signed: true, negative: x < 0}, nil
	case uint64:
		return number{i: int64(x), u: x, signed: x <= math.MaxInt64}, nil
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			return number{}, errors.New("not an exact integer")
		}
		return integer(int64(x))
	}
	return number{}, errors.New("not a number")
}

func float(data any) (float64, error) {
	switch x := data.(type) {
	case json.Number:
		return x.Float64()
	case float64:
		return x, nil
	}
	n, err := integer(data)
	if err != nil {
		return 0, err
	}
	if n.signed {
		return float64(n.i), nil
	}
	return float64(n.u), nil
}

// kindOf describes a value read from a trace for an error, briefly.
func kindOf(data any) string {
	switch x := data.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(excerpt(x))
	case json.Number:
		return excerpt(string(x))
	case bool:
		return strconv.FormatBool(x)
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return excerpt(fmt.Sprint(data))
}
