package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/cockroachdb/errors"
)

// Version is the trace format version this code writes and reads. Version
// 2 records a registration before the chunk it creates (its outcome as
// the record's effect), and the engine's and its peers' sharding. Version 3
// records a chunk that stops as it ends: its ChunkEnded says whether the
// forward actor forgets it, and its room neither stops it nor sends that
// Forget. A decode server's trace is the same in both, and version 2 of it
// is read.
const Version = 3

// Header is a trace's first line.
type Header struct {
	// Format is the format version ("kvstream_trace": 1).
	Format        int    `json:"kvstream_trace"`
	EngineVersion string `json:"engine_version"`
	// StartedUnixNano is when recording started; record times are relative.
	StartedUnixNano int64 `json:"started_unix_ns"`
	// Side is who recorded the trace: none for an engine (the prefill
	// side), SideDecode for a decode server.
	Side string `json:"side,omitempty"`
	// Config is an engine's configuration (none in a decode trace).
	Config Config `json:"config,omitzero"`
	// Decode is a decode server's configuration (side "decode" only).
	Decode *DecodeConfig `json:"decode,omitempty"`
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
	SingleDestination bool             `json:"single_destination,omitempty"`
	Buffers           []BufferGeometry `json:"buffers"`
	// Sharding is the prefill rank's sharding (Config.Sharding) and
	// Replicas its replica rule (reshard.ReplicaRule), when it reshards.
	Sharding *Sharding `json:"sharding,omitempty"`
	Replicas int       `json:"replicas,omitempty"`
}

// BufferGeometry is one prefill buffer's geometry (addresses are left
// out): what decode.BufferGeometry also describes, the same fields but for
// the type of Pages.
type BufferGeometry struct {
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
	// Line is the trace line the record was read from (0 when it was not
	// read from a file), for errors that point at it.
	Line int `json:"-"`
}

// Where names the record for an error: its line when it was read from a
// file, and its sequence number.
func (r *Record) Where() string {
	if r.Line > 0 {
		return fmt.Sprintf("trace line %d (record %d)", r.Line, r.Seq)
	}
	return fmt.Sprintf("record %d", r.Seq)
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

// Trace is a parsed trace, all of it in memory: what the recorder
// snapshots, and what tests build and edit. Replays read a Stream.
type Trace struct {
	Header  Header
	Records []Record
}

// Read parses a whole trace into memory through a Reader (same bounds and
// checks). Replays stream instead; Read is for tests and small traces.
func Read(r io.Reader) (*Trace, error) {
	rd, err := NewReader(r)
	if err != nil {
		return nil, err
	}
	t := &Trace{Header: rd.Header()}
	for {
		rec, err := rd.Next()
		if err == io.EOF {
			return t, nil
		}
		if err != nil {
			return nil, err
		}
		t.Records = append(t.Records, rec)
	}
}

// Stream returns the trace's records as a Stream, each checked against the
// header's geometry as a Reader checks them (an error names the record).
// Its header is not validated here: replays validate it before use.
func (t *Trace) Stream() Stream { return &sliceStream{t: t} }

type sliceStream struct {
	t         *Trace
	i         int
	validated bool
}

func (s *sliceStream) Header() Header { return s.t.Header }

func (s *sliceStream) Next() (Record, error) {
	if s.i >= len(s.t.Records) {
		return Record{}, io.EOF
	}
	if !s.validated {
		// CheckRecord relies on a validated header.
		if err := s.t.Header.Validate(); err != nil {
			return Record{}, err
		}
		s.validated = true
	}
	rec := s.t.Records[s.i]
	s.i++
	if err := s.t.Header.CheckRecord(&rec); err != nil {
		return Record{}, errors.Wrapf(err, "record %d of %d (seq %d)", s.i, len(s.t.Records), rec.Seq)
	}
	return rec, nil
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
