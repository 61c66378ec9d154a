package trace

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testDecodeConfig is a valid decode server's configuration: a CP group of
// two ranks over a pool of two buffers.
func testDecodeConfig() *DecodeConfig {
	return &DecodeConfig{Server: "kvstream-decode", MaxSessions: 64, MaxRoomsPerSession: 4096, ByeGrace: 1e10, MaxPoolBytes: 1 << 36,
		Group: &DecodeGroup{Size: 2, Rule: "shared", PageSize: 4}, Prefills: []string{"p0"},
		Pool: []BufferGeometry{{Name: "K", ItemLen: 64, Pages: 16}, {Name: "V", ItemLen: 64, Pages: 16}}}
}

func decodeHeaderLine(c *DecodeConfig) string {
	b, err := json.Marshal(Header{Format: Version, Side: SideDecode, Decode: c})
	if err != nil {
		panic(err)
	}
	return string(b)
}

var testDecodeHeader = decodeHeaderLine(testDecodeConfig())

// TestDecodeHeaderBoundsNameTheField: a decode trace's header is checked
// before a core is built from it; each error names the field, its value
// and the bound, and the reader refuses the header naming its line.
func TestDecodeHeaderBoundsNameTheField(t *testing.T) {
	require.NoError(t, testDecodeConfig().Validate())
	// Invalid UTF-8, which no JSON line carries (json writes it as U+FFFD),
	// in a header built in memory.
	bad := testDecodeConfig()
	bad.Prefills = []string{"\xff"}
	assert.ErrorContains(t, bad.Validate(), `trace header: prefill 0 "\xff": not UTF-8`)
	for _, c := range []struct {
		edit func(*DecodeConfig)
		want string
	}{
		{func(c *DecodeConfig) { c.Server = "" }, "trace header: decode server: empty"},
		{func(c *DecodeConfig) { c.Server = strings.Repeat("s", 300) }, "trace header: decode server: 300 bytes, above the bound of 256"},
		{func(c *DecodeConfig) { c.MaxSessions = 0 }, "trace header: max_sessions 0: must be at least 1"},
		{func(c *DecodeConfig) { c.MaxSessions = 1 << 40 }, "trace header: max_sessions 1099511627776: above the bound of 65536"},
		{func(c *DecodeConfig) { c.MaxRoomsPerSession = -1 }, "trace header: max_rooms_per_session -1: must be at least 1"},
		{func(c *DecodeConfig) { c.MaxChunksPerRoom = -1 }, "trace header: max_chunks_per_room -1: negative"},
		{func(c *DecodeConfig) { c.PageSize = -1 }, "trace header: page_size -1: negative"},
		{func(c *DecodeConfig) { c.PageSize = 1 << 21 }, "trace header: page_size 2097152: above the bound of 1048576"},
		{func(c *DecodeConfig) { c.RoomTimeout = -1 }, "trace header: room_timeout_ns -1: negative"},
		{func(c *DecodeConfig) { c.ByeGrace = 1 << 62 }, "trace header: bye_grace_ns 4611686018427387904: above the bound of 604800000000000"},
		{func(c *DecodeConfig) { c.MaxPoolBytes = 0 }, "trace header: max_pool_bytes 0"},
		{func(c *DecodeConfig) { c.Prefills = make([]string, MaxDecodePrefills+1) }, "trace header: prefills 4097: above the bound of 4096"},
		{func(c *DecodeConfig) { c.Prefills = []string{strings.Repeat("p", 300)} }, "trace header: prefill 0: 300 bytes, above the bound of 256"},
		{func(c *DecodeConfig) { c.Group.Size = 5000 }, "trace header: group size 5000: want 1 to 1024"},
		{func(c *DecodeConfig) { c.Group.PageSize = 0 }, "trace header: group page_size 0"},
		{func(c *DecodeConfig) { c.Group.Rule = "sideways" }, `trace header: group rule "sideways"`},
		{func(c *DecodeConfig) { c.Pool = make([]BufferGeometry, MaxBuffers+1) }, "trace header: pool 16385: above the bound of 16384"},
		{func(c *DecodeConfig) { c.Pool[1].Pages = 1 << 40 }, "trace header: pool buffer 1 (V): pages 1099511627776: above the bound of 16777216"},
		{func(c *DecodeConfig) { c.Pool[1].Pages = 0 }, "trace header: pool buffer 1 (V): pages 0: must be at least 1"},
		{func(c *DecodeConfig) { c.Pool[0].ItemLen = 0 }, "trace header: pool buffer 0 (K): item_len 0"},
		{func(c *DecodeConfig) { c.Pool[0].ItemLen = 1 << 40 }, "trace header: pool buffer 0 (K): item_len 1099511627776: above the bound of 268435456"},
		{func(c *DecodeConfig) { c.Pool[0].Layer = 3 }, "trace header: pool buffer 0 (K): layer 3"},
		{func(c *DecodeConfig) {
			c.Pool = []BufferGeometry{{Name: "A", ItemLen: 1 << 20, Pages: 1 << 22}, {Name: "B", ItemLen: 1 << 20, Pages: 1 << 22}}
		}, "trace header: pool buffer 1 (B): the pool's item_len × pages reach 8796093022208 bytes, above the bound of 4398046511104"},
	} {
		cfg := testDecodeConfig()
		c.edit(cfg)
		err := cfg.Validate()
		require.Error(t, err, c.want)
		assert.Contains(t, err.Error(), c.want)
		_, err = NewReader(strings.NewReader("# a decode trace\n" + decodeHeaderLine(cfg) + "\n"))
		require.Error(t, err, c.want)
		assert.Contains(t, err.Error(), "trace line 2: "+c.want)
	}
}

// TestHeaderSides: the side says which configuration a header carries,
// and a header that mixes them, or names another side, is refused.
func TestHeaderSides(t *testing.T) {
	for _, c := range []struct {
		h    Header
		want string
	}{
		{Header{Format: Version, Side: "prefill", Config: testConfig()}, `trace header: side "prefill": want "decode" or none`},
		{Header{Format: Version, Side: SideDecode}, `trace header: side "decode" without its decode configuration`},
		{Header{Format: Version, Side: SideDecode, Decode: testDecodeConfig(), Config: testConfig()}, "trace header: config: an engine configuration in a decode trace"},
		{Header{Format: Version, Config: testConfig(), Decode: testDecodeConfig()}, "trace header: decode: a decode configuration in an engine's trace"},
	} {
		assert.ErrorContains(t, c.h.Validate(), c.want)
	}
	// An engine's header is written as before: no side, its config.
	assert.NotContains(t, testHeader, `"side"`)
	assert.NotContains(t, testHeader, `"decode"`)
	assert.Contains(t, testHeader, `"config":{"hook_layers":4`)
	// A decode trace's header has no engine configuration.
	assert.NotContains(t, testDecodeHeader, `"config"`)
	assert.Contains(t, testDecodeHeader, `"side":"decode"`)
}

// TestDecodeTraceReads: a decode trace's records are checked for their
// names (their messages are the decode replay's to decode), their line
// bound is MaxLine, and their effects keep their names (a decode core's
// Reply is not an engine's renamed answer).
func TestDecodeTraceReads(t *testing.T) {
	in := testDecodeHeader + "\n" +
		`{"seq":1,"actor":"decode","id":"kvstream-decode","type":"StateMsg","msg":{},"effects":["Reply {\"Err\":null}"]}` + "\n" +
		`{"seq":2,"actor":"decode","id":"kvstream-decode","type":"AddChunk","msg":{"Dests":1000000000}}` + "\n" +
		`{"seq":3,"actor":"decode","id":"` + strings.Repeat("i", 300) + `","type":"StateMsg","msg":{}}` + "\n"
	rd, err := NewReader(strings.NewReader(in))
	require.NoError(t, err)
	assert.Equal(t, MaxLine, rd.LineBound())
	rec, err := rd.Next()
	require.NoError(t, err)
	assert.Equal(t, []string{`Reply {"Err":null}`}, rec.Effects)
	_, err = rd.Next()
	require.NoError(t, err, "an engine's message type in a decode trace is not decoded as the engine's")
	_, err = rd.Next()
	assert.ErrorContains(t, err, "trace line 4 (record 3, decode StateMsg): id: 300 bytes, above the bound of 256")

	tr := &Trace{Header: Header{Format: Version, Side: SideDecode, Decode: testDecodeConfig()},
		Records: []Record{{Seq: 1, Actor: DecodeActor, ID: "kvstream-decode", Type: "StateMsg"}, {Seq: 2, Actor: DecodeActor}}}
	s := tr.Stream()
	_, err = s.Next()
	require.NoError(t, err)
	_, err = s.Next()
	assert.ErrorContains(t, err, "record 2 of 2 (seq 2): record without actor or type")
}

// TestRecorderAddEncoded: a record encoded by its vocabulary keeps its
// message and type as given.
func TestRecorderAddEncoded(t *testing.T) {
	r := NewRecorder(4, Header{Side: SideDecode, Decode: testDecodeConfig()})
	r.AddEncoded(DecodeActor, "kvstream-decode", "TimerMsg", map[string]any{"ID": uint64(3)}, []string{"Log {}"})
	s := r.Snapshot()
	require.Len(t, s.Records, 1)
	assert.Equal(t, Record{Seq: 1, T: s.Records[0].T, Actor: DecodeActor, ID: "kvstream-decode", Type: "TimerMsg", Msg: map[string]any{"ID": uint64(3)},
		Effects: []string{"Log {}"}}, s.Records[0])
	assert.Equal(t, Version, s.Header.Format)
	assert.Equal(t, SideDecode, s.Header.Side)
}
