package trace

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages"
)

// ParseChunkID reads a ChunkID back.
func ParseChunkID(s string) (messages.Chunk, error) {
	var c messages.Chunk
	bad := func() (messages.Chunk, error) {
		return c, errors.Newf("chunk id %q: want room:start-end[@epoch]#serial", Excerpt(s, 64))
	}
	room, rest, ok := strings.Cut(s, ":")
	if !ok {
		return bad()
	}
	rng, serial, ok := strings.Cut(rest, "#")
	if !ok {
		return bad()
	}
	rng, epoch, hasEpoch := strings.Cut(rng, "@")
	start, end, ok := strings.Cut(rng, "-")
	if !ok {
		return bad()
	}
	var err error
	if c.Room, err = strconv.ParseUint(room, 10, 64); err != nil {
		return bad()
	}
	if c.Start, err = strconv.Atoi(start); err != nil {
		return bad()
	}
	if c.End, err = strconv.Atoi(end); err != nil {
		return bad()
	}
	if c.Serial, err = strconv.ParseUint(serial, 10, 64); err != nil {
		return bad()
	}
	if hasEpoch {
		if c.Epoch, err = strconv.ParseUint(epoch, 10, 64); err != nil {
			return bad()
		}
	}
	return c, nil
}

// Event is a recorded event in a replay: it has completed (a replay has no
// GPU) and keeps its recorded name.
type Event string

// Wait implements messages.Event.
func (Event) Wait(context.Context) error { return nil }

// Query mirrors cuda.Event.
func (Event) Query() (bool, error) { return true, nil }

// TraceName keeps the recorded name.
func (e Event) TraceName() string { return string(e) }

// fields is a record's message as decoded JSON.
type fields map[string]any

func (f fields) int(k string) (int64, error) {
	switch v := f[k].(type) {
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return 0, errors.Newf("field %s: %s is not an integer", k, Excerpt(string(v), 64))
		}
		return n, nil
	case float64:
		return int64(v), nil
	case int64:
		return v, nil
	case nil:
		return 0, nil
	}
	return 0, errors.Newf("field %s: %s is not a number", k, Excerpt(fmt.Sprint(f[k]), 64))
}

func (f fields) str(k string) string {
	s, _ := f[k].(string)
	return s
}

// strs reads a list of strings, at most maxStrs of them (a recording is
// input: its lists are bounded like its numbers); other values are skipped.
func (f fields) strs(k string) []string {
	l, _ := f[k].([]any)
	var out []string
	for _, x := range l {
		if s, ok := x.(string); ok && len(out) < maxStrs {
			out = append(out, s)
		}
	}
	return out
}

// maxStrs bounds a recorded list of names (a chunk's destination peers:
// at most its 256 destinations).
const maxStrs = 256

func (f fields) err(k string) error {
	if s := f.str(k); s != "" {
		return errors.New(s)
	}
	return nil
}

func (f fields) event(k string) messages.Event {
	if s := f.str(k); s != "" {
		return Event(s)
	}
	return nil
}

func (f fields) time(k string) (time.Time, error) {
	n, err := f.int(k)
	if err != nil || n == 0 {
		return time.Time{}, err
	}
	return time.Unix(0, n), nil
}

func (f fields) bool(k string) bool { b, _ := f[k].(bool); return b }

// Decode rebuilds a message a replay feeds from outside the actors: façade
// calls (AddChunk, Finish, Drop at the manager; Begin, Boundary, End at the
// forward actor) and what hardware and timers report to a chunk (Submitted,
// BatchDone, Timeout, TornDown, Quiesced, BatchOverdue, Cancel).
func Decode(rec *Record) (any, error) {
	f, ok := rec.Msg.(map[string]any)
	if !ok && rec.Msg != nil {
		return nil, errors.Newf("record %d: message is not an object", rec.Seq)
	}
	fl := fields(f)
	var errs []error
	num := func(k string) int64 {
		n, err := fl.int(k)
		errs = append(errs, err)
		return n
	}
	tm := func(k string) time.Time {
		t, err := fl.time(k)
		errs = append(errs, err)
		return t
	}
	var msg any
	switch rec.Type {
	case "AddChunk":
		c, err := ParseChunkID(fl.str("Chunk"))
		errs = append(errs, err)
		msg = &messages.AddChunk{Chunk: c, PerLayer: fl.bool("PerLayer"), Owned: int(num("Owned")), Dests: int(num("Dests")),
			Peers: fl.strs("Peers"), Reply: make(chan messages.Added, 1)}
	case "Finish":
		msg = &messages.Finish{Room: uint64(num("Room")), Timeout: time.Duration(num("Timeout")), Event: fl.event("Event"),
			EventErr: fl.err("EventErr"), Abandoned: fl.err("Abandoned"), Reply: make(chan messages.Result, 1)}
	case "Drop":
		msg = &messages.Drop{Room: uint64(num("Room")), Timeout: time.Duration(num("Timeout")), Peer: fl.str("Peer"), Reply: make(chan []messages.Result, 1)}
	case "Begin":
		msg = &messages.Begin{Forward: uint64(num("Forward")), At: tm("At"), Bound: make(chan int, 1)}
	case "Boundary":
		msg = &messages.Boundary{Forward: uint64(num("Forward")), Group: int(num("Group")), Event: fl.event("Event"), Err: fl.err("Err")}
	case "End":
		msg = &messages.End{Forward: uint64(num("Forward")), Event: fl.event("Event"), Err: fl.err("Err"), At: tm("At")}
	case "Submitted":
		msg = &messages.Submitted{Seq: int(num("Seq")), Dest: int(num("Dest")), Posted: fl.bool("Posted"), Err: fl.err("Err"),
			Bytes: uint64(num("Bytes")), Blocks: int(num("Blocks")), WaitStart: tm("WaitStart"), WaitEnd: tm("WaitEnd"), PostedAt: tm("PostedAt")}
	case "BatchDone":
		msg = &messages.BatchDone{Seq: int(num("Seq")), Dest: int(num("Dest")), Err: fl.err("Err"), At: tm("At"), Broken: fl.bool("Broken"),
			Try: int(num("Try"))}
	case "Timeout":
		msg = &messages.Timeout{}
	case "TornDown":
		msg = &messages.TornDown{Err: fl.err("Err")}
	case "Quiesced":
		msg = &messages.Quiesced{Seq: int(num("Seq")), Dest: int(num("Dest")), Err: fl.err("Err")}
	case "BatchOverdue":
		msg = &messages.BatchOverdue{Seq: int(num("Seq")), Dest: int(num("Dest")), Try: int(num("Try")), InFlight: uint64(num("InFlight"))}
	case "Cancel":
		msg = &messages.Cancel{Reason: fl.err("Reason")}
	default:
		return nil, errors.Newf("record %d: %s is not a message a replay feeds from outside", rec.Seq, rec.Type)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Wrapf(err, "record %d (%s)", rec.Seq, rec.Type)
	}
	return msg, nil
}

// Canonical renders a recorded or replayed message as one comparable line.
func Canonical(msg any) string {
	b, err := json.Marshal(msg)
	if err != nil {
		return "<unencodable: " + err.Error() + ">"
	}
	return string(b)
}

// Work is a submitter's Work in a replay, encoded as the chunk shell's
// actors.Work is: the core's Work plus the chunk's job, named by its chunk.
type Work struct {
	messages.Work
	Job messages.Chunk
}
