package trace

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"

	"github.com/cockroachdb/errors"
)

// Version is the trace format version this code writes and reads.
const Version = 1

// Header is a trace's first line.
type Header struct {
	// Format is the format version ("kvstream_trace": 1).
	Format        int    `json:"kvstream_trace"`
	EngineVersion string `json:"engine_version"`
	// StartedUnixNano is when recording started; record times are relative.
	StartedUnixNano int64  `json:"started_unix_ns"`
	Config          Config `json:"config"`
	// Records is how many records follow; Dropped how many the bounded ring
	// overwrote before the trace was written (0: the trace is complete).
	Records int    `json:"records"`
	Dropped uint64 `json:"dropped"`
}

// Config is what a replay needs of the engine's configuration.
type Config struct {
	HookLayers    int    `json:"hook_layers"`
	GroupSize     int    `json:"group_size"`
	PageSize      int    `json:"page_size"`
	CPSize        int    `json:"cp_size"`
	CPRank        int    `json:"cp_rank"`
	CPRule        string `json:"cp_rule"`
	Submitters    int    `json:"submitters"`
	FinishTimeout int64  `json:"finish_timeout_ns"`
	PerLayer      bool   `json:"per_layer"`
	// SingleDestination is Config.SingleDestinationPerLayer (the reference
	// rule: per-layer only for rooms with one real destination).
	SingleDestination bool     `json:"single_destination,omitempty"`
	Buffers           []Buffer `json:"buffers"`
}

// Buffer is one prefill buffer's geometry (addresses are left out).
type Buffer struct {
	Name    string `json:"name"`
	Layer   int    `json:"layer"`
	ItemLen uint64 `json:"item_len"`
	Pages   int    `json:"pages"`
}

// Record is one message an actor handled, or one façade call.
type Record struct {
	Seq   uint64 `json:"seq"`
	T     int64  `json:"t_ns"` // since the start of recording, monotonic
	Actor string `json:"actor"`
	ID    string `json:"id"`
	// Sender is the sending actor when the transport knows it (requests).
	Sender  string   `json:"sender,omitempty"`
	Type    string   `json:"type"`
	Msg     any      `json:"msg"`
	Effects []string `json:"effects,omitempty"`
}

// Actor kinds.
const (
	Engine    = "engine" // façade calls: Register, AddPeer
	Manager   = "manager"
	Room      = "room"
	Chunk     = "chunk"
	Forward   = "forward"
	Submitter = "submitter"
)

// Trace is a parsed trace.
type Trace struct {
	Header  Header
	Records []Record
}

// Read parses a trace: a header line then records, one JSON object per
// line. Blank lines and lines starting with '#' are comments (testdata
// traces explain themselves). An unknown version or a malformed line is an
// error that names the line.
func Read(r io.Reader) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<30)
	t := &Trace{}
	line, seenHeader := 0, false
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		if !seenHeader {
			if err := json.Unmarshal([]byte(text), &t.Header); err != nil {
				return nil, errors.Wrapf(err, "trace line %d: header", line)
			}
			if t.Header.Format != Version {
				return nil, errors.Newf("trace line %d: format version %d, this kvstream reads version %d", line, t.Header.Format, Version)
			}
			seenHeader = true
			continue
		}
		var rec Record
		dec := json.NewDecoder(strings.NewReader(text))
		dec.UseNumber()
		if err := dec.Decode(&rec); err != nil {
			return nil, errors.Wrapf(err, "trace line %d", line)
		}
		if rec.Actor == "" || rec.Type == "" {
			return nil, errors.Newf("trace line %d: record without actor or type", line)
		}
		for i, e := range rec.Effects {
			rec.Effects[i] = currentEffect(e)
		}
		t.Records = append(t.Records, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, errors.Wrapf(err, "trace line %d", line+1)
	}
	if !seenHeader {
		return nil, errors.New("trace: no header line (is this a kvstream trace?)")
	}
	return t, nil
}

// effectRenames maps the effect names that traces recorded before the
// effects were named for who answers what (docs/ARCHITECTURE.md, Actors) to
// today's names, so that such traces still replay.
var effectRenames = map[string]string{
	"Answer":    "AnswerBegin",
	"AnswerAdd": "AnswerRegister",
	"Reply":     "AnswerFinish",
}

// currentEffect returns a recorded effect line ("Type {...}") as this
// version of kvstream writes it: under the effect's current name, and
// without the job a Submit's Work carried, always null there, before the
// chunk shell attached the job outside the message (actors.Work).
func currentEffect(line string) string {
	name, rest, ok := strings.Cut(line, " ")
	if !ok {
		return line
	}
	if now, renamed := effectRenames[name]; renamed {
		return now + " " + rest
	}
	if name == "Submit" {
		return name + " " + strings.Replace(rest, `"Job":null,`, "", 1)
	}
	return line
}

// Write writes a trace.
func Write(w io.Writer, t *Trace) error {
	t.Header.Records = len(t.Records)
	enc := json.NewEncoder(w)
	if err := enc.Encode(t.Header); err != nil {
		return err
	}
	for i := range t.Records {
		if err := enc.Encode(&t.Records[i]); err != nil {
			return errors.Wrapf(err, "record %d", t.Records[i].Seq)
		}
	}
	return nil
}
