package trace

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testConfig is a small valid geometry: 4 hook layers in groups of 2, 64
// pages of 16 bytes per buffer.
func testConfig() Config {
	return Config{HookLayers: 4, GroupSize: 2, PageSize: 4, CPSize: 1, CPRule: "shared", Submitters: 2, FinishTimeout: 1e9,
		PerLayer: true, Buffers: []BufferGeometry{{Name: "KV0", Layer: 0, ItemLen: 16, Pages: 64}, {Name: "KV1", Layer: 1, ItemLen: 16, Pages: 64},
			{Name: "KV2", Layer: 2, ItemLen: 16, Pages: 64}, {Name: "KV3", Layer: 3, ItemLen: 16, Pages: 64}}}
}

func headerLine(c Config) string {
	b, err := json.Marshal(Header{Format: Version, Config: c})
	if err != nil {
		panic(err)
	}
	return string(b)
}

var testHeader = headerLine(testConfig())

// TestHeaderBoundsNameTheField: each header an attacker or a corrupted
// file could hand over is refused before anything is sized from it, and
// the error names the field, its value and the bound.
func TestHeaderBoundsNameTheField(t *testing.T) {
	manyBuffers := make([]BufferGeometry, MaxBuffers+1)
	for i := range manyBuffers {
		manyBuffers[i] = BufferGeometry{Name: "B", ItemLen: 1, Pages: 1}
	}
	// Each buffer within the item and page bounds, the pool past its
	// bound; 4096 buffers of 2^52 bytes would sum to 2^64, which wraps to 0
	// if the sum were not checked as it goes.
	twoPools := []BufferGeometry{{Name: "A", ItemLen: 1 << 20, Pages: 1 << 22}, {Name: "B", ItemLen: 1 << 20, Pages: 1 << 22}}
	wraps := make([]BufferGeometry, 4096)
	for i := range wraps {
		wraps[i] = BufferGeometry{Name: "W", ItemLen: MaxItemLen, Pages: MaxPages}
	}
	for _, c := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.HookLayers = 1e9 }, "trace header: hook_layers 1000000000: above the bound of 4096"},
		{func(c *Config) { c.Submitters = 1e8 }, "trace header: submitters 100000000: above the bound of 1024"},
		{func(c *Config) { c.Submitters = -1 }, "trace header: submitters -1: must be at least 1"},
		{func(c *Config) { c.HookLayers = 0 }, "trace header: hook_layers 0: must be at least 1"},
		{func(c *Config) { c.GroupSize = 1 << 40 }, "trace header: group_size 1099511627776: above the bound of 4096"},
		{func(c *Config) { c.PageSize = -4 }, "trace header: page_size -4: must be at least 1"},
		{func(c *Config) { c.PageSize = 1 << 20 }, "trace header: page_size 1048576: above the bound of 65536"},
		{func(c *Config) { c.CPSize = 1 << 30 }, "trace header: cp_size 1073741824: above the bound of 1024"},
		{func(c *Config) { c.CPRank = 1 }, "trace header: cp_rank 1: must be in [0, 1)"},
		{func(c *Config) { c.CPRank = -1 }, "trace header: cp_rank -1: must be in [0, 1)"},
		{func(c *Config) { c.CPRule = "sideways" }, `trace header: cp_rule "sideways"`},
		{func(c *Config) { c.FinishTimeout = -1 }, "trace header: finish_timeout_ns -1: negative"},
		{func(c *Config) { c.FinishTimeout = 1 << 62 }, "trace header: finish_timeout_ns 4611686018427387904: above the bound of 86400000000000"},
		{func(c *Config) { c.Buffers = nil }, "trace header: buffers 0: must be at least 1"},
		{func(c *Config) { c.Buffers = manyBuffers }, "trace header: buffers 16385: above the bound of 16384"},
		{func(c *Config) { c.Buffers[1].Pages = 1 << 40 }, "trace header: buffer 1 (KV1): pages 1099511627776: above the bound of 16777216"},
		{func(c *Config) { c.Buffers[1].Pages = -1 }, "trace header: buffer 1 (KV1): pages -1: must be at least 1"},
		{func(c *Config) { c.Buffers[2].ItemLen = 1 << 63 }, "trace header: buffer 2 (KV2): item_len 9223372036854775808: above the bound of 268435456"},
		{func(c *Config) { c.Buffers[2].ItemLen = 0 }, "trace header: buffer 2 (KV2): item_len 0"},
		{func(c *Config) { c.Buffers[0].Layer = 1 << 40 }, "trace header: buffer 0 (KV0): layer 1099511627776: outside"},
		{func(c *Config) { c.Buffers[0].Name = strings.Repeat("n", 1000) }, "trace header: buffer 0 name: 1000 bytes, above the bound of 256"},
		{func(c *Config) { c.Buffers = twoPools }, "trace header: buffer 1 (B): the buffers' item_len × pages reach 8796093022208 bytes, above the bound of 4398046511104"},
		{func(c *Config) { c.Buffers = wraps }, "trace header: buffer 0 (W): the buffers' item_len × pages reach 4503599627370496 bytes"},
	} {
		cfg := testConfig()
		c.edit(&cfg)
		err := cfg.Validate()
		require.Error(t, err, c.want)
		assert.Contains(t, err.Error(), c.want)

		// The reader refuses the same header, naming its line, and reads
		// no further.
		in := &countingReader{r: strings.NewReader("# a comment\n" + headerLine(cfg) + "\n" + `{"seq":1,"actor":"forward","id":"forward","type":"Begin","msg":{}}` + "\n")}
		_, err = NewReader(in)
		require.Error(t, err, c.want)
		assert.Contains(t, err.Error(), "trace line 2: "+c.want)
	}
	valid := testConfig()
	require.NoError(t, valid.Validate(), "the test geometry itself is valid")
}

// countingReader counts what was read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// endless yields a prefix, then the byte fill for size bytes, lazily: a
// 300 MB line that never exists in memory.
type endless struct {
	prefix []byte
	fill   byte
	size   int64
}

func (e *endless) Read(p []byte) (int, error) {
	if len(e.prefix) > 0 {
		n := copy(p, e.prefix)
		e.prefix = e.prefix[n:]
		return n, nil
	}
	if e.size <= 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	n = min(n, e.size)
	for i := range p[:n] {
		p[i] = e.fill
	}
	e.size -= n
	return int(n), nil
}

// TestLongLineStopsAtTheBound: a 300 MB record line (the attack that took
// 2.8 GB) is refused naming its line and the bound, after the reader read
// at most the bound plus its buffers: the line is never held.
func TestLongLineStopsAtTheBound(t *testing.T) {
	const size = 300 << 20
	prefix := testHeader + "\n" + `{"seq":1,"actor":"chunk","id":"1:0-8#1","type":"GroupReady","msg":{"Err":"`
	in := &countingReader{r: &endless{prefix: []byte(prefix), fill: 'x', size: size}}
	rd, err := NewReader(in)
	require.NoError(t, err)
	bound := rd.LineBound()
	require.Less(t, bound, size/100, "the test geometry's bound is far below the line")
	_, err = rd.Next()
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("trace line 2: longer than the bound of %d bytes", bound))
	assert.LessOrEqual(t, in.n, int64(len(testHeader)+1+bound+2*readBuffer), "read at most the bound and two buffers")
	_, again := rd.Next()
	assert.Equal(t, err, again, "a failed stream stays failed")

	// The header line has its own bound, before any geometry is known.
	in = &countingReader{r: &endless{prefix: []byte(`{"kvstream_trace":1,"engine_version":"`), fill: 'v', size: size}}
	_, err = NewReader(in)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("trace line 1: longer than the bound of %d bytes", MaxHeaderLine))
	assert.LessOrEqual(t, in.n, int64(MaxHeaderLine+2*readBuffer))

	// A long comment is a long line too.
	in = &countingReader{r: &endless{prefix: []byte(testHeader + "\n# "), fill: '#', size: size}}
	rd, err = NewReader(in)
	require.NoError(t, err)
	_, err = rd.Next()
	assert.ErrorContains(t, err, "trace line 2: longer than the bound")
	assert.LessOrEqual(t, in.n, int64(len(testHeader)+1+bound+2*readBuffer))
}

// TestLineBoundFollowsTheGeometry: the record line bound grows with the
// largest buffer's pages (a registration lists them), and never past
// MaxLine.
func TestLineBoundFollowsTheGeometry(t *testing.T) {
	c := testConfig()
	small := c.LineBound()
	assert.Equal(t, MinLineBound+lineBytesPerPage*64, small)
	c.Buffers[3].Pages = 1 << 20
	assert.Equal(t, MinLineBound+lineBytesPerPage<<20, c.LineBound())
	c.Buffers[3].Pages = MaxPages
	assert.Equal(t, MaxLine, c.LineBound())

	// A line just within the bound is read; one byte more is refused.
	rec := `{"seq":1,"actor":"chunk","id":"1:0-8#1","type":"GroupReady","msg":{"Err":"`
	pad := func(n int) string { return rec + strings.Repeat("y", n-len(rec)-3) + `"}}` }
	rd, err := NewReader(strings.NewReader(testHeader + "\n" + pad(small) + "\n" + pad(small+1) + "\n"))
	require.NoError(t, err)
	got, err := rd.Next()
	require.NoError(t, err)
	assert.Equal(t, 2, got.Line)
	_, err = rd.Next()
	assert.ErrorContains(t, err, "trace line 3: longer than the bound")
}

// TestRecordsBeyondTheGeometryNameTheLine: a record whose numbers would
// size something in a replay beyond the header's geometry is refused, and
// the error names its line.
func TestRecordsBeyondTheGeometryNameTheLine(t *testing.T) {
	for _, c := range []struct{ rec, want string }{
		{`{"seq":7,"actor":"manager","id":"manager","type":"AddChunk","msg":{"Chunk":"1:0-8#1","Dests":1000000000}}`, "Dests 1000000000: outside [0, 256]"},
		{`{"seq":7,"actor":"manager","id":"manager","type":"AddChunk","msg":{"Chunk":"1:0-8#1","Owned":-3}}`, "Owned -3"},
		{`{"seq":7,"actor":"manager","id":"manager","type":"AddChunk","msg":{"Chunk":"1:0-9000000000000#1"}}`, "tokens outside [0, 67108864]"},
		{`{"seq":7,"actor":"manager","id":"manager","type":"AddChunk","msg":{"Chunk":"nonsense"}}`, `chunk id "nonsense"`},
		{`{"seq":7,"actor":"forward","id":"forward","type":"Boundary","msg":{"Group":2}}`, "Group 2: outside [0, 2)"},
		{`{"seq":7,"actor":"forward","id":"forward","type":"Boundary","msg":{"Group":1e300}}`, "field Group: 1e300 is not an integer"},
		{`{"seq":7,"actor":"chunk","id":"1:0-8#1","type":"Submitted","msg":{"Seq":5,"Dest":0}}`, "Seq 5: outside [-1, 2)"},
		{`{"seq":7,"actor":"chunk","id":"1:0-8#1","type":"BatchDone","msg":{"Seq":0,"Dest":300}}`, "Dest 300: outside [0, 256)"},
		{`{"seq":7,"actor":"manager","id":"manager","type":"Finish","msg":{"Room":1,"Timeout":-5}}`, "Timeout -5: negative"},
		{`{"seq":7,"actor":"engine","id":"engine","type":"RegisterCall","msg":{"Room":1,"End":8,"SrcPages":[0,64]}}`, "RegisterCall: SrcPages[1] 64: outside [0, 64)"},
		{`{"seq":7,"actor":"engine","id":"engine","type":"RegisterCall","msg":{"Room":1,"End":8,"TotalPages":-1}}`, "RegisterCall: TotalPages -1"},
		{`{"seq":7,"actor":"engine","id":"engine","type":"RegisterCall","msg":{"Room":1,"End":8,"Infos":[{"Peer":"d0","DstPages":[99999999]}]}}`, "RegisterCall: info 0 DstPages[0] 99999999: outside [0, 16777216)"},
		{`{"seq":7,"actor":"engine","id":"engine","type":"RegisterCall","msg":"not a call"}`, "RegisterCall: json: cannot unmarshal string"},
		{`{"seq":7,"actor":"engine","id":"engine","type":"AddPeerCall","msg":{"ID":"d0","ItemLen":[16],"Pages":[1000000000]}}`, "AddPeerCall: Pages[0] 1000000000: outside [0, 16777216]"},
		{`{"seq":7,"actor":"engine","id":"engine","type":"AddPeerCall","msg":{"ID":"d0","ItemLen":[18446744073709551615],"Pages":[2]}}`, "AddPeerCall: ItemLen[0] 18446744073709551615: above the bound of 268435456"},
		{`{"seq":7,"actor":"chunk","id":"` + strings.Repeat("i", 300) + `","type":"Timeout","msg":{}}`, "id: 300 bytes, above the bound of 256"},
		{`{"seq":7,"actor":"chunk","type":"Timeout"}`, ""},
		{`{"seq":7,"actor":"chunk","id":"x","type":"Timeout","msg":{}} trailing`, "data after the JSON object"},
	} {
		rd, err := NewReader(strings.NewReader(testHeader + "\n# comment\n\n" + c.rec + "\n"))
		require.NoError(t, err)
		_, err = rd.Next()
		if c.want == "" {
			assert.NoError(t, err, c.rec)
			continue
		}
		require.Error(t, err, c.rec)
		assert.Contains(t, err.Error(), "trace line 4", c.rec)
		assert.Contains(t, err.Error(), c.want, c.rec)
		assert.Less(t, len(err.Error()), 600, "errors quote excerpts, not records")
	}
}

// TestTraceStreamChecksRecords: an in-memory trace streams its records
// with the same checks, naming the record.
func TestTraceStreamChecksRecords(t *testing.T) {
	tr := &Trace{Header: Header{Format: Version, Config: testConfig()}, Records: []Record{
		{Seq: 1, Actor: Forward, ID: "forward", Type: "Begin", Msg: map[string]any{}},
		{Seq: 2, Actor: Forward, ID: "forward", Type: "Boundary", Msg: map[string]any{"Group": json.Number("9")}},
	}}
	s := tr.Stream()
	rec, err := s.Next()
	require.NoError(t, err)
	assert.Equal(t, uint64(1), rec.Seq)
	_, err = s.Next()
	assert.ErrorContains(t, err, "record 2 of 2 (seq 2): Group 9: outside [0, 2)")

	bad := &Trace{Header: Header{Config: Config{HookLayers: 1e9}}, Records: tr.Records}
	_, err = bad.Stream().Next()
	assert.ErrorContains(t, err, "trace header: hook_layers 1000000000")
}

// TestScenarioTracesRead: every committed scenario trace reads within the
// bounds of its geometry.
func TestScenarioTracesRead(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("..", "tests", "testdata", "traces", "*.jsonl"))
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		tr, err := Read(bytes.NewReader(raw))
		require.NoError(t, err, p)
		assert.Equal(t, tr.Header.Records, len(tr.Records), p)
	}
}

// FuzzReadTrace: whatever the bytes, reading a trace (an engine's or a
// decode server's) never panics, and every error names the line (or says
// there is no header); what it returns passes the checks a replay relies
// on.
func FuzzReadTrace(f *testing.F) {
	if raw, err := os.ReadFile(filepath.Join("..", "tests", "testdata", "traces", "partial_last_group.jsonl")); err == nil {
		f.Add(raw)
	}
	f.Add([]byte(testHeader + "\n" + `{"seq":1,"actor":"manager","id":"manager","type":"AddChunk","msg":{"Chunk":"1:0-8#1","Dests":1,"Owned":2}}` + "\n"))
	f.Add([]byte(testHeader + "\n" + `{"seq":2,"actor":"engine","id":"engine","type":"RegisterCall","msg":{"Room":1,"End":8,"SrcPages":[0,1],"Infos":[{"Peer":"d0","DstPages":[3,4]}]}}` + "\n"))
	f.Add([]byte(testHeader + "\n" + `{"seq":3,"actor":"forward","id":"forward","type":"Boundary","msg":{"Group":1,"Event":"ev:1"}}` + "\n"))
	f.Add([]byte(`{"kvstream_trace":3,"config":{"hook_layers":1000000000}}`))
	f.Add([]byte(`{"kvstream_trace":2,"config":{"hook_layers":4}}`))
	// Decode traces: their header's side and configuration, and records
	// the reader checks for their names only.
	if raw, err := os.ReadFile(filepath.Join("..", "decode", "testdata", "traces", "lost_prefill.jsonl")); err == nil {
		f.Add(raw)
	}
	f.Add([]byte(testDecodeHeader + "\n" + `{"seq":1,"actor":"decode","id":"kvstream-decode","type":"ExpectMsg","msg":{"Room":1,"Pages":[0,1]},"effects":["Reply {}"]}` + "\n"))
	f.Add([]byte(`{"kvstream_trace":2,"side":"decode","decode":{"server":"s","max_sessions":1,"max_rooms_per_session":1,"max_pool_bytes":1,"group":{"size":2000}}}`))
	f.Add([]byte(`{"kvstream_trace":2,"side":"decode","decode":{"server":"s","max_sessions":1,"max_rooms_per_session":1,"max_pool_bytes":1,"pool":[{"name":"K","item_len":64,"pages":4}]}}` + "\n" +
		`{"seq":1,"actor":"decode","id":"s","type":"TimerMsg","msg":{"ID":1}}`))
	f.Add([]byte(`{"kvstream_trace":3,"side":"elsewhere","config":{}}`))
	f.Add([]byte("# nothing\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rd, err := NewReader(bytes.NewReader(data))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "trace line ") && err.Error() != "trace: no header line (is this a kvstream trace?)" {
				t.Fatalf("header error does not name the line: %v", err)
			}
			return
		}
		h := rd.Header()
		require.NoError(t, h.Validate())
		for {
			rec, err := rd.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				if !strings.HasPrefix(err.Error(), "trace line ") {
					t.Fatalf("record error does not name the line: %v", err)
				}
				return
			}
			require.Positive(t, rec.Line)
			require.NoError(t, h.CheckRecord(&rec))
		}
	})
}
