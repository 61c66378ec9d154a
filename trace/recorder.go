package trace

import (
	"io"
	"sync"
	"time"
)

// DefaultCapacity is the ring's size in records when none is given: about
// 100-300 MB of JSON at most, hours of a busy engine's boundaries.
const DefaultCapacity = 1 << 20

// Recorder keeps the last records in a bounded ring. It is safe for
// concurrent use; each Add encodes its message, so it costs allocations,
// which is why an engine without tracing installs no recorder at all.
type Recorder struct {
	start  time.Time
	header Header

	mu   sync.Mutex
	ring []Record
	// open marks the ring's records begun and not finished: a snapshot
	// ends before the first of them (its effects are not known yet).
	open    []bool
	next    int
	full    bool
	seq     uint64
	dropped uint64
}

// NewRecorder returns a recorder of at most capacity records.
func NewRecorder(capacity int, header Header) *Recorder {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	now := time.Now()
	header.Format = Version
	header.StartedUnixNano = now.UnixNano()
	return &Recorder{start: now, header: header, ring: make([]Record, capacity), open: make([]bool, capacity)}
}

// Add records that actor (kind, id) handled msg and its core returned
// effects.
func (r *Recorder) Add(kind, id, sender string, msg any, effects []string) {
	r.Finish(r.Begin(kind, id, sender, msg), effects)
}

// Slot is a record begun and not yet finished.
type Slot struct {
	seq uint64
	idx int
}

// Begin records that an actor starts handling msg and returns the slot its
// effects go to. Numbering records when handling starts keeps them causal:
// a message is sent while its sender handles something, so its receiver's
// record always comes after the sender's, even when the receiver runs on
// the sender's goroutine (the forward actor's synchronized dispatcher).
func (r *Recorder) Begin(kind, id, sender string, msg any) Slot {
	return r.begin(Record{Actor: kind, ID: id, Sender: sender, Type: TypeName(msg), Msg: Encode(msg)})
}

// AddEncoded records that actor (kind, id) handled a message of type typ,
// which the caller encoded itself (msg is JSON-able data), and returned
// effects: for a vocabulary that encodes its own messages (package
// decode's core, whose messages decode back exactly).
func (r *Recorder) AddEncoded(kind, id, typ string, msg any, effects []string) {
	r.Finish(r.begin(Record{Actor: kind, ID: id, Type: typ, Msg: msg}), effects)
}

func (r *Recorder) begin(rec Record) Slot {
	rec.T = int64(time.Since(r.start))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	rec.Seq = r.seq
	if r.full {
		r.dropped++
	}
	slot := Slot{seq: r.seq, idx: r.next}
	r.ring[r.next] = rec
	r.open[r.next] = true
	r.next++
	if r.next == len(r.ring) {
		r.next, r.full = 0, true
	}
	return slot
}

// Finish adds the effects of a begun record (unless the ring overwrote it).
func (r *Recorder) Finish(s Slot, effects []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ring[s.idx].Seq == s.seq {
		r.open[s.idx] = false
		if len(effects) > 0 {
			r.ring[s.idx].Effects = effects
		}
	}
}

// Snapshot returns the trace recorded so far, oldest record first. It ends
// before the first record begun and not finished (a DumpTrace while an
// actor handles a message, or while a registration waits for its answer):
// that record's effects are not known yet, and a replay would find them
// missing; the records after it are left out too, so that the trace is
// what was recorded up to a moment, numbered without a gap.
func (r *Recorder) Snapshot() *Trace {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &Trace{Header: r.header}
	t.Header.Dropped = r.dropped
	add := func(recs []Record, open []bool) bool {
		for i := range recs {
			if open[i] {
				return false
			}
			t.Records = append(t.Records, recs[i])
		}
		return true
	}
	if !r.full || add(r.ring[r.next:], r.open[r.next:]) {
		add(r.ring[:r.next], r.open[:r.next])
	}
	t.Header.Records = len(t.Records)
	return t
}

// Dump writes the trace recorded so far.
func (r *Recorder) Dump(w io.Writer) error { return Write(w, r.Snapshot()) }
