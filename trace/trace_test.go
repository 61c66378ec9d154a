package trace

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvstream/kvstream/messages"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChunkIDRoundTrip(t *testing.T) {
	for _, c := range []messages.Chunk{
		{ChunkKey: messages.ChunkKey{Room: 7, Start: 0, End: 16}, Serial: 1},
		{ChunkKey: messages.ChunkKey{Room: 1 << 60, Start: 32, End: 32, Epoch: 4}, Serial: 99},
	} {
		got, err := ParseChunkID(ChunkID(c))
		require.NoError(t, err)
		assert.Equal(t, c, got)
	}
	for _, bad := range []string{"", "7", "7:0-16", "x:0-16#1", "7:0#1", "7:0-16@x#1"} {
		_, err := ParseChunkID(bad)
		assert.Error(t, err, bad)
	}
}

func TestEncodeKeepsMeaningDropsAddresses(t *testing.T) {
	ev := Event("ev:1")
	m := &messages.Finish{Room: 3, Timeout: time.Second, Event: ev, EventErr: errors.New("boom"), Reply: make(chan messages.Result)}
	got := Canonical(Encode(m))
	assert.Equal(t, `{"Event":"ev:1","EventErr":"boom","Room":3,"Timeout":1000000000}`, got,
		"Abandoned, tagged trace:\"omitempty\", is left out when nil: traces recorded before it read the same")
	m.Abandoned = errors.New("context canceled")
	assert.Equal(t, `{"Abandoned":"context canceled","Event":"ev:1","EventErr":"boom","Room":3,"Timeout":1000000000}`, Canonical(Encode(m)))
	r := messages.Result{Status: messages.Dropped}
	assert.Contains(t, Canonical(Encode(r)), `"Status":"DROPPED"`, "statuses read as words")
}

func TestDecodeRoundTripsExternalMessages(t *testing.T) {
	c := messages.Chunk{ChunkKey: messages.ChunkKey{Room: 2, Start: 8, End: 16}, Serial: 5}
	at := time.Unix(0, 1234567890)
	for _, m := range []any{
		&messages.AddChunk{Chunk: c, PerLayer: true, Owned: 3, Dests: 1},
		&messages.Finish{Room: 2, Timeout: time.Second, Event: Event("ev:9")},
		&messages.Finish{Room: 2, Timeout: time.Second, Event: Event("ev:9"), Abandoned: errors.New("context canceled")},
		&messages.Drop{Room: 2, Timeout: time.Second},
		&messages.Begin{Forward: 4, At: at},
		&messages.Boundary{Forward: 4, Group: 1, Event: Event("ev:2")},
		&messages.End{Forward: 4, Event: Event("ev:3"), Err: errors.New("record failed"), At: at},
		&messages.Submitted{Seq: -1, Dest: 1, Posted: true, Bytes: 64, Blocks: 2, WaitStart: at, WaitEnd: at, PostedAt: at},
		&messages.BatchDone{Seq: 0, Err: errors.New("lost"), At: at},
		&messages.Timeout{},
		&messages.TornDown{Err: errors.New("may still land")},
	} {
		var buf bytes.Buffer
		r := NewRecorder(8, Header{Config: testConfig()})
		r.Add(Chunk, "x", "", m, nil)
		require.NoError(t, r.Dump(&buf))
		tr, err := Read(&buf)
		require.NoError(t, err)
		got, err := Decode(&tr.Records[0])
		require.NoError(t, err, TypeName(m))
		assert.Equal(t, Canonical(Encode(m)), Canonical(Encode(got)), TypeName(m))
	}
	_, err := Decode(&Record{Seq: 4, Type: "GroupReady", Msg: map[string]any{}})
	assert.ErrorContains(t, err, "record 4: GroupReady is not a message a replay feeds from outside")
}

func TestRingKeepsTheLastRecords(t *testing.T) {
	r := NewRecorder(3, Header{})
	for i := 0; i < 5; i++ {
		r.Add(Manager, "manager", "", &messages.Timeout{}, []string{strings.Repeat("x", i)})
	}
	s := r.Snapshot()
	assert.Equal(t, uint64(2), s.Header.Dropped)
	require.Len(t, s.Records, 3)
	assert.Equal(t, []uint64{3, 4, 5}, []uint64{s.Records[0].Seq, s.Records[1].Seq, s.Records[2].Seq})

	// A slot overwritten before its effects arrive keeps the newer record.
	slot := r.Begin(Manager, "manager", "", &messages.Timeout{})
	for i := 0; i < 3; i++ {
		r.Add(Manager, "manager", "", &messages.Timeout{}, nil)
	}
	r.Finish(slot, []string{"late"})
	for _, rec := range r.Snapshot().Records {
		assert.NotEqual(t, []string{"late"}, rec.Effects)
	}
}

func TestReadErrorsNameTheLine(t *testing.T) {
	_, err := Read(strings.NewReader("# comment\n\n" + `{"kvstream_trace":4}` + "\n"))
	assert.ErrorContains(t, err, "trace line 3: format version 4")
	_, err = Read(strings.NewReader(`{"kvstream_trace":1}` + "\n"))
	assert.ErrorContains(t, err, "trace line 1: format version 1: recorded by an older kvstream")
	// An engine's trace of version 2 had rooms stop their chunks: refused by
	// name; a decode server's, unchanged since, is read.
	_, err = Read(strings.NewReader(`{"kvstream_trace":2,"config":{}}` + "\n"))
	assert.ErrorContains(t, err, "trace line 1: format version 2: recorded by an older kvstream, whose rooms stopped their chunks")
	_, err = Read(strings.NewReader(`{"kvstream_trace":2,"side":"decode","decode":{"server":"s","max_sessions":1,"max_rooms_per_session":1,"max_pool_bytes":1}}` + "\n"))
	assert.NoError(t, err)
	_, err = Read(strings.NewReader(testHeader + "\n" + "not json\n"))
	assert.ErrorContains(t, err, "trace line 2")
	_, err = Read(strings.NewReader("# only comments\n"))
	assert.ErrorContains(t, err, "no header line")
}

// A trace recorded before the answer effects were renamed and the job left
// messages.Work still replays: Read gives its effects today's form.
func TestReadRenamesOldEffects(t *testing.T) {
	in := testHeader + `
{"seq":1,"actor":"forward","id":"forward","type":"Begin","msg":{},"effects":["Answer {\"N\":1}"]}
{"seq":2,"actor":"room","id":"1","type":"AddChunk","msg":{"Chunk":"1:0-8#1"},"effects":["AnswerAdd {\"Added\":{}}","AnswerDrop {\"Results\":null}"]}
{"seq":3,"actor":"chunk","id":"1:0-8#1","type":"BatchDone","msg":{},"effects":["ChunkEnded {}","Reply {\"Result\":{}}"]}
{"seq":4,"actor":"chunk","id":"1:0-8#1","type":"GroupReady","msg":{},"effects":["Submit {\"Work\":{\"Buffers\":[0],\"Dest\":0,\"Event\":\"ev:1\",\"Job\":null,\"Seq\":0}}"]}
`
	tr, err := Read(strings.NewReader(in))
	require.NoError(t, err)
	require.Len(t, tr.Records, 4)
	assert.Equal(t, []string{`AnswerBegin {"N":1}`}, tr.Records[0].Effects)
	assert.Equal(t, []string{`AnswerRegister {"Added":{}}`, `AnswerDrop {"Results":null}`}, tr.Records[1].Effects)
	assert.Equal(t, []string{`ChunkEnded {}`, `AnswerFinish {"Result":{}}`}, tr.Records[2].Effects)
	assert.Equal(t, []string{`Submit {"Work":{"Buffers":[0],"Dest":0,"Event":"ev:1","Seq":0}}`}, tr.Records[3].Effects)
}

// A value that names itself for traces (a chunk's job) is encoded as its
// name, wherever it sits.
func TestEncodeUsesTraceNames(t *testing.T) {
	type work struct {
		messages.Work
		Job *named
	}
	got := Canonical(Encode(&work{Work: messages.Work{Seq: 2, Buffers: []int{1}}, Job: &named{"7:0-16#1"}}))
	assert.Equal(t, `{"Buffers":[1],"Chunk":"0:0-0#0","Dest":0,"Event":null,"Job":"7:0-16#1","Seq":2}`, got)
	assert.Equal(t, `{"Buffers":null,"Chunk":"0:0-0#0","Dest":0,"Event":null,"Job":null,"Seq":0}`, Canonical(Encode(&work{})))
}

type named struct{ name string }

func (n *named) TraceName() string { return n.name }
