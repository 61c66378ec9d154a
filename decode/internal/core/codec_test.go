package core

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// markedErr is an error with every class the codec keeps, wrapped.
func markedErr() error {
	err := errors.Wrap(errors.New("link down"), "revoke")
	for _, c := range errorClasses {
		err = errors.Mark(err, c.mark)
	}
	return err
}

// sampleMsgs is one message of every type, every field set (the protobuf
// messages' too: TestCodecSamplesSetEveryField holds them to it).
func sampleMsgs() []Msg {
	from := Origin{Node: "127.0.0.1:9100", Peer: "prefill-0"}
	hello := &wire.Hello{Version: 3, Prefill: "p0", SessionAddress: "127.0.0.1:9100", SessionId: "s-1", PageSize: 16,
		Metadata: map[string]string{RankKey: "1", "model": "m"},
		Buffers:  []*wire.Buffer{{Name: "K", Layer: 2, ItemLen: 64, Pages: 1 << 40}, {Name: "V", Layer: -1, ItemLen: 1, Pages: 3}}}
	notice := &wire.ChunkNotice{Session: "tok", Room: 1 << 63, Start: -4, End: 1 << 40, Last: true, Status: wire.Status_FAILED,
		Error: "timeout", NotQuiesced: true, Bytes: 1<<64 - 1, Positions: []int64{0, -1, 1 << 62}, DstPages: []int64{7, 8, 9}}
	return []Msg{
		HelloMsg{From: from, Hello: hello, Token: "0123abcd"},
		NoticeMsg{From: from, Notice: notice},
		ByeMsg{From: from, Bye: &wire.Bye{Session: "tok", Chunks: 12, Aborted: "forward 3: decode lost"}, Reply: "7"},
		DepartedMsg{Actor: "127.0.0.1:9100/s-1", Grace: 10 * time.Second},
		CancelMsg{From: from, Cancel: &wire.Cancel{Session: "tok", Room: 1 << 63, Reason: "client gone", NotQuiesced: true}},
		CancelRoomMsg{Room: 9, Cause: "evicted"},
		PeerLostMsg{Session: "tok", Cause: errors.New("no heartbeat answer for 3.5s")},
		RevokedMsg{Session: "tok", Err: markedErr()},
		TimerMsg{ID: 1<<64 - 1},
		ExpectMsg{Room: 3, Pages: []int{4, 5, -6}, From: "p0"},
		ReleaseMsg{Room: 9},
		DisconnectMsg{Identity: "p0", Cause: errors.Mark(errors.New("evicted"), ErrBadInput)},
		LookupMsg{Room: 1},
		DrainMsg{},
		CloseMsg{},
		StateMsg{},
		AdmittedMsg{Err: errors.New("model mismatch")},
		SizedMsg{Buffers: []Buffer{{Name: "K", Base: 1 << 40, ItemLen: 64, Pages: 8, Memory: rdma.MemoryCUDA}}, Err: errors.New("")},
		AccessMsg{Address: []byte{0, 1, 2, 0xff}, Revocable: true, Err: errors.New("no access point")},
		VerifiedMsg{Err: errors.Mark(errors.New("checksum"), ErrChunkFailed)},
	}
}

// sameValue compares two values of the vocabulary as the core reads them:
// errors by text and class, protobuf messages with proto.Equal, fields
// left out of traces (interfaces other than error) not at all.
func sameValue(a, b reflect.Value) bool {
	if a.Type() != b.Type() {
		return false
	}
	if a.Type() == errorType {
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		ea, eb := a.Interface().(error), b.Interface().(error)
		return reflect.DeepEqual(encodeError(ea), encodeError(eb))
	}
	if m, ok := a.Interface().(proto.Message); ok && a.Kind() == reflect.Pointer {
		return proto.Equal(known(m), known(b.Interface().(proto.Message)))
	}
	if a.Kind() == reflect.Struct {
		for i := range a.NumField() {
			f := a.Type().Field(i)
			if skippedField(f) {
				continue
			}
			if !sameValue(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	}
	if a.Kind() == reflect.Slice && a.Type().Elem().Kind() == reflect.Struct {
		if a.Len() != b.Len() || a.IsNil() != b.IsNil() {
			return false
		}
		for i := range a.Len() {
			if !sameValue(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// known is m without the fields this version of the protocol does not
// know (a newer peer's), which the core never reads and a trace leaves
// out.
func known(m proto.Message) proto.Message {
	if m == nil || !m.ProtoReflect().IsValid() {
		return m
	}
	c := proto.Clone(m)
	var clear func(r protoreflect.Message)
	clear = func(r protoreflect.Message) {
		r.SetUnknown(nil)
		r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range v.List().Len() {
					clear(v.List().Get(i).Message())
				}
			case fd.Message() != nil && !fd.IsMap():
				clear(v.Message())
			}
			return true
		})
	}
	clear(c.ProtoReflect())
	return c
}

// roundTrip encodes m, writes it as a trace line does, reads it back as
// the trace reader does (numbers as json.Number) and decodes it.
func roundTrip(t testing.TB, m Msg) Msg {
	t.Helper()
	b, err := json.Marshal(EncodeMsg(m))
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var data any
	require.NoError(t, dec.Decode(&data))
	back, err := DecodeMsg(MsgType(m), data)
	require.NoError(t, err, "%s", b)
	return back
}

// TestCodecRoundTripsEveryMessage: every message decodes back to what was
// encoded, from a trace's text and from the encoder's own data (an
// in-memory trace); the errors keep their text and classes, and the
// protobuf messages are proto.Equal.
func TestCodecRoundTripsEveryMessage(t *testing.T) {
	samples := sampleMsgs()
	seen := map[string]bool{}
	for _, m := range samples {
		seen[MsgType(m)] = true
		back := roundTrip(t, m)
		assert.True(t, sameValue(reflect.ValueOf(m), reflect.ValueOf(back)), "%s: %#v\nback: %#v", MsgType(m), m, back)
		direct, err := DecodeMsg(MsgType(m), EncodeMsg(m))
		require.NoError(t, err, MsgType(m))
		assert.True(t, sameValue(reflect.ValueOf(m), reflect.ValueOf(direct)), "%s from the encoder's data", MsgType(m))
	}
	assert.Len(t, seen, len(msgTypes), "a sample of every message type")
	for name := range msgTypes {
		assert.True(t, seen[name], "no sample of %s", name)
	}

	err := roundTrip(t, RevokedMsg{Session: "s", Err: markedErr()}).(RevokedMsg).Err
	assert.Equal(t, "revoke: link down", err.Error())
	for _, c := range errorClasses {
		assert.True(t, errors.Is(err, c.mark), "the error keeps %s", c.name)
	}
	assert.False(t, errors.Is(roundTrip(t, AdmittedMsg{Err: errors.New("x")}).(AdmittedMsg).Err, ErrBadInput), "and only its classes")
	assert.Nil(t, roundTrip(t, AdmittedMsg{}).(AdmittedMsg).Err, "no error stays none")
	assert.NotNil(t, roundTrip(t, AdmittedMsg{Err: errors.New("")}).(AdmittedMsg).Err, "an error without text stays an error")
	assert.Nil(t, roundTrip(t, HelloMsg{}).(HelloMsg).Hello, "a missing Hello stays missing")
}

// TestCodecSamplesSetEveryField: the samples set every field of every
// message, the protobuf messages' included, so that a field added to the
// vocabulary or to the wire protocol is covered by the round trip (or
// fails it) instead of passing unset.
func TestCodecSamplesSetEveryField(t *testing.T) {
	var check func(path string, v reflect.Value)
	check = func(path string, v reflect.Value) {
		if m, ok := v.Interface().(proto.Message); ok && v.Kind() == reflect.Pointer {
			r := m.ProtoReflect()
			fields := r.Descriptor().Fields()
			for i := range fields.Len() {
				assert.True(t, r.Has(fields.Get(i)), "%s: protobuf field %s unset", path, fields.Get(i).Name())
			}
			return
		}
		if v.Kind() != reflect.Struct {
			return
		}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if skippedField(f) {
				continue
			}
			fv := v.Field(i)
			if f.Name != "Err" && f.Name != "Cause" { // an error's empty text is its own case
				assert.False(t, fv.IsZero(), "%s.%s unset", path, f.Name)
			}
			if fv.Kind() == reflect.Slice && fv.Len() > 0 {
				fv = fv.Index(0)
			}
			check(path+"."+f.Name, fv)
		}
	}
	for _, m := range sampleMsgs() {
		check(MsgType(m), reflect.ValueOf(m))
	}
}

// TestCodecRefusesWhatDoesNotFit: a trace is hostile input; what does not
// decode is an error naming the field.
func TestCodecRefusesWhatDoesNotFit(t *testing.T) {
	num := func(s string) json.Number { return json.Number(s) }
	for _, c := range []struct {
		typ  string
		data any
		want string
	}{
		{"NoSuchMsg", map[string]any{}, `type "NoSuchMsg": not a message of the decode core`},
		{"TimerMsg", "x", `TimerMsg: "x", want an object`},
		{"TimerMsg", map[string]any{"ID": num("-1")}, "TimerMsg.ID: -1, want an integer of uint64"},
		{"TimerMsg", map[string]any{"ID": num("18446744073709551616")}, "TimerMsg.ID: 18446744073709551616, want an integer"},
		{"TimerMsg", map[string]any{"ID": num("1.5")}, "TimerMsg.ID: 1.5, want an integer"},
		{"TimerMsg", map[string]any{"Id": num("1")}, `TimerMsg: no field "Id"`},
		{"ExpectMsg", map[string]any{"Pages": []any{num("1"), "2"}}, `ExpectMsg.Pages[1]: "2", want an integer of int`},
		{"HelloMsg", map[string]any{"Hello": map[string]any{"PageSize": num("4294967296")}}, "HelloMsg.Hello.PageSize: 4294967296, want an integer of uint32"},
		{"HelloMsg", map[string]any{"Hello": map[string]any{"state": map[string]any{}}}, `HelloMsg.Hello: no field "state"`},
		{"NoticeMsg", map[string]any{"Notice": map[string]any{"Status": "SIDEWAYS"}}, `NoticeMsg.Notice.Status: "SIDEWAYS" is not a value of wire.Status`},
		{"RevokedMsg", map[string]any{"Err": "gone"}, `RevokedMsg.Err: "gone", want an error`},
		{"RevokedMsg", map[string]any{"Err": map[string]any{"Text": "x", "Marks": []any{"ErrSideways"}}}, `RevokedMsg.Err.Marks[0]: "ErrSideways": not a class`},
		{"RevokedMsg", map[string]any{"Err": map[string]any{"Text": "x", "Stack": "y"}}, `RevokedMsg.Err: no field "Stack" in an error`},
		{"AccessMsg", map[string]any{"Address": "!!"}, "AccessMsg.Address: illegal base64"},
		{"SizedMsg", map[string]any{"Buffers": []any{map[string]any{"Region": "r"}}}, `SizedMsg.Buffers[0]: no field "Region"`},
		{"DrainMsg", nil, "DrainMsg: null, want an object"},
	} {
		_, err := DecodeMsg(c.typ, c.data)
		require.Error(t, err, c.want)
		assert.Contains(t, err.Error(), c.want)
	}
	// A value the enum does not know, as protobuf keeps it: by number.
	m, err := DecodeMsg("NoticeMsg", map[string]any{"Notice": map[string]any{"Status": "9"}})
	require.NoError(t, err)
	assert.Equal(t, wire.Status(9), m.(NoticeMsg).Notice.Status)
}

// TestEffectLinesReadable: effects are one line each, enums and durations
// by name, errors with their classes.
func TestEffectLinesReadable(t *testing.T) {
	lines := EffectLines([]Effect{
		ArmTimer{ID: 3, After: 1500 * time.Millisecond},
		AnswerNotice{Code: wire.Code_ROOM_FAILED, Text: "no"},
		RoomEnded{Room: Room{ID: 2, Chunks: []Chunk{{Status: messages.Failed}}}, Err: errors.Mark(errors.New("lost"), ErrPrefillLost), Outcome: "lost"},
		ReleasePool{},
	})
	assert.Equal(t, `ArmTimer {"After":"1.5s","ID":3}`, lines[0])
	assert.Equal(t, `AnswerNotice {"Code":"ROOM_FAILED","Reason":"","Text":"no"}`, lines[1])
	assert.Contains(t, lines[2], `"Status":"FAILED"`)
	assert.Contains(t, lines[2], `"Err":{"Marks":["ErrPrefillLost"],"Text":"lost"}`)
	assert.Equal(t, "ReleasePool {}", lines[3])
	assert.Nil(t, EffectLines(nil))
}
