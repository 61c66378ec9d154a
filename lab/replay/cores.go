package replay

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
)

// Divergence is the first place a replay differs from its recording.
type Divergence struct {
	Seq uint64
	// Line is the record's line in the trace file (0: not read from one).
	Line     int
	Actor    string
	ID       string
	Type     string
	Reason   string
	Recorded []string
	Replayed []string
}

// Bounds on what a divergence prints: a recorded line may be megabytes
// long and an actor may have thousands of messages pending, and a person
// reads the first bytes of a few of them.
const (
	// MaxExcerpt is the bytes of each recorded or replayed line printed.
	MaxExcerpt = 300
	// MaxExcerptLines is the lines printed of each side.
	MaxExcerptLines = 20
)

// String renders the divergence for people: each side's first
// MaxExcerptLines lines, each cut at MaxExcerpt bytes with its length.
func (d *Divergence) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "divergence at %s (%s %s handling %s): %s", d.where(), trace.Excerpt(d.Actor, MaxExcerpt), trace.Excerpt(d.ID, MaxExcerpt),
		trace.Excerpt(d.Type, MaxExcerpt), d.Reason)
	side := func(name string, lines []string) {
		fmt.Fprintf(&b, "\n  %s:", name)
		if len(lines) == 0 {
			b.WriteString(" (nothing)")
		}
		for i, l := range lines {
			if i == MaxExcerptLines {
				fmt.Fprintf(&b, "\n    … and %d more lines", len(lines)-i)
				break
			}
			fmt.Fprintf(&b, "\n    %s", trace.Excerpt(l, MaxExcerpt))
		}
	}
	side("recorded", d.Recorded)
	side("replayed", d.Replayed)
	return b.String()
}

func (d *Divergence) where() string {
	if d.Line > 0 {
		return fmt.Sprintf("record %d on trace line %d", d.Seq, d.Line)
	}
	return fmt.Sprintf("record %d", d.Seq)
}

// Summary describes a trace.
type Summary struct {
	// Records is how many records the replay read: the whole trace, or up
	// to the first divergence.
	Records  int
	Replayed int // messages fed to a core or matched
	Rooms    int
	Chunks   int
	Forwards int
	// Statuses counts chunk outcomes (SUCCESS, FAILED, DROPPED) as the
	// replayed cores decided them.
	Statuses map[string]int
	// Results are the chunk outcomes in the order they were decided.
	Results []ChunkResult
	// Skipped counts records about actors whose beginning the ring dropped.
	Skipped int
}

// ChunkResult is one chunk's outcome in a replay.
type ChunkResult struct {
	Chunk  string
	Status string
	Err    string
}

// Outcome is a core replay's result.
type Outcome struct {
	Summary
	Divergence *Divergence
}

type inbox struct {
	lines []string
	msgs  []any
}

type replayer struct {
	header  trace.Header
	layout  *plan.Layout
	out     *Outcome
	manager *actors.ManagerCore
	forward *actors.ForwardCore
	rooms   map[uint64]*actors.RoomCore
	chunks  map[string]*actors.ChunkCore
	inboxes map[string]*inbox // "kind/id"; submitters share "submitter/*"
	seen    map[string]bool
	// stopped are the chunks their room stopped. The actor stops
	// asynchronously, so it may still handle what was in its mailbox
	// (a submitter's late Submitted); its core had ended and answers
	// nothing.
	stopped map[string]bool
}

// Cores replays a trace through fresh functional cores, one record at a
// time: it holds the replayed actors' state, never the trace. The header
// is validated before anything is allocated from it, and every record
// comes checked against it (trace.Stream); stream errors end the replay.
func Cores(s trace.Stream) (*Outcome, error) {
	h := s.Header()
	l, err := Layout(h.Config)
	if err != nil {
		return nil, err
	}
	r := &replayer{header: h, layout: l, out: &Outcome{Summary: Summary{Statuses: map[string]int{}}},
		manager: actors.NewManagerCore(), forward: actors.NewForwardCore(),
		rooms: map[uint64]*actors.RoomCore{}, chunks: map[string]*actors.ChunkCore{}, inboxes: map[string]*inbox{}, seen: map[string]bool{}, stopped: map[string]bool{}}
	for {
		rec, err := s.Next()
		if err == io.EOF {
			return r.out, nil
		}
		if err != nil {
			return nil, err
		}
		r.out.Records++
		d, err := r.step(&rec)
		if err != nil {
			return nil, err
		}
		if d != nil {
			r.out.Divergence = d
			return r.out, nil // the first divergence is the report; what follows it is not read
		}
	}
}

// Layout validates a trace's configuration (trace.Config.Validate: every
// bound, before anything is allocated) and rebuilds the engine's layout
// from it.
func Layout(c trace.Config) (*plan.Layout, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rule, err := cp.ParseRule(c.CPRule)
	if err != nil {
		return nil, errors.Wrap(err, "trace header")
	}
	bufs := make([]plan.Buffer, len(c.Buffers))
	keys := make([]rdma.LocalKey, len(c.Buffers))
	for i, b := range c.Buffers {
		bufs[i] = plan.Buffer{Name: b.Name, Base: uint64(i+1) << 32, ItemLen: b.ItemLen, Pages: b.Pages, Layer: b.Layer}
	}
	l, err := plan.NewLayout(bufs, keys, c.HookLayers, c.GroupSize, c.PageSize, cp.CP{Size: c.CPSize, Rank: c.CPRank, Rule: rule})
	return l, errors.Wrap(err, "trace header")
}

// external says whether an actor kind receives a message type from outside
// the actors (fed from the trace) rather than from another actor.
func external(kind, typ string) bool {
	switch kind {
	case trace.Manager:
		return typ == "AddChunk" || typ == "Finish" || typ == "Drop"
	case trace.Forward:
		return typ == "Begin" || typ == "Boundary" || typ == "End"
	case trace.Chunk:
		switch typ {
		case "Submitted", "BatchDone", "Timeout", "TornDown", "Cancel":
			return true
		}
	case trace.Submitter:
		return typ == "Waited"
	}
	return false
}

func key(kind, id string) string { return kind + "/" + id }

func (r *replayer) step(rec *trace.Record) (*Divergence, error) {
	if rec.Actor == trace.Engine {
		return nil, nil
	}
	if rec.Actor == trace.Submitter && rec.Type == "Waited" {
		return nil, nil // what the hardware did; its Submitted reaches the chunk as its own record
	}
	div := func(reason string, recorded, replayed []string) *Divergence {
		return &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: reason, Recorded: recorded, Replayed: replayed}
	}
	var msg any
	if external(rec.Actor, rec.Type) {
		m, err := trace.Decode(rec)
		if err != nil {
			return nil, errors.Wrapf(err, "%s", rec.Where())
		}
		msg = m
	} else {
		k := key(rec.Actor, rec.ID)
		if rec.Actor == trace.Submitter {
			k = key(trace.Submitter, "*")
		}
		want := rec.Type + " " + trace.Canonical(rec.Msg)
		box := r.inboxes[k]
		found := -1
		if box != nil {
			for i, l := range box.lines {
				if l == want {
					found = i
					break
				}
			}
		}
		if found < 0 {
			if r.header.Dropped > 0 && !r.seen[k] {
				r.out.Skipped++ // its beginning was overwritten in the ring
				return nil, nil
			}
			var pending []string
			if box != nil {
				pending = box.lines
			}
			return div("the recording shows this message handled, but the replayed actors never sent it (replayed lines: what they sent this actor and it has not handled)",
				[]string{want}, pending), nil
		}
		msg = box.msgs[found]
		box.lines = append(box.lines[:found:found], box.lines[found+1:]...)
		box.msgs = append(box.msgs[:found:found], box.msgs[found+1:]...)
	}
	r.out.Replayed++
	if rec.Actor == trace.Submitter {
		return nil, nil // a submitter has no core; the Work matched
	}
	effs, d := r.feed(rec, msg)
	if d != nil {
		return d, nil
	}
	got := trace.Effects(effs)
	if !equal(got, rec.Effects) {
		return div("the replayed core's effects differ from the recorded ones", rec.Effects, got), nil
	}
	r.route(rec, effs)
	return nil, nil
}

// feed steps the core of the record's actor.
func (r *replayer) feed(rec *trace.Record, msg any) ([]any, *Divergence) {
	var effs []actors.Effect
	switch rec.Actor {
	case trace.Manager:
		effs = r.manager.Step(msg)
	case trace.Forward:
		effs = r.forward.Step(msg)
	case trace.Room:
		room, err := strconv.ParseUint(rec.ID, 10, 64)
		core := r.rooms[room]
		if err != nil || core == nil {
			return nil, &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: "no such room in the replay"}
		}
		effs = core.Step(msg)
	case trace.Chunk:
		core := r.chunks[rec.ID]
		if core == nil && r.stopped[rec.ID] {
			return nil, nil // an ended core's effects: none
		}
		if core == nil {
			return nil, &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: "no such chunk in the replay"}
		}
		effs = core.Step(msg)
	default:
		return nil, &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: "unknown actor kind"}
	}
	out := make([]any, len(effs))
	for i, e := range effs {
		out[i] = e
	}
	return out, nil
}

// route delivers effects the way the actor shells do.
func (r *replayer) route(rec *trace.Record, effs []any) {
	send := func(kind, id string, msg any) {
		k := key(kind, id)
		r.seen[k] = true
		b := r.inboxes[k]
		if b == nil {
			b = &inbox{}
			r.inboxes[k] = b
		}
		b.lines = append(b.lines, trace.TypeName(msg)+" "+trace.Canonical(trace.Encode(msg)))
		b.msgs = append(b.msgs, msg)
	}
	for _, e := range effs {
		switch e := e.(type) {
		case actors.SpawnRoom:
			r.rooms[e.Room] = actors.NewRoomCore(e.Room)
			r.out.Rooms++
			r.seen[key(trace.Room, strconv.FormatUint(e.Room, 10))] = true
		case actors.Route:
			send(trace.Room, strconv.FormatUint(e.Room, 10), e.Msg)
		case actors.StopRoom:
			delete(r.rooms, e.Room)
		case actors.SpawnChunk:
			id := trace.ChunkID(e.Add.Chunk)
			plan := &plan.Plan{Chunk: e.Add.Chunk, Owned: e.Add.Owned, Dests: make([]plan.Dest, e.Add.Dests)}
			if e.Add.PerLayer {
				plan.Mode = cp.PerLayer
			}
			r.chunks[id] = actors.NewChunkCore(r.layout, plan)
			r.out.Chunks++
			r.seen[key(trace.Chunk, id)] = true
			send(trace.Forward, "forward", &messages.Pending{Chunk: e.Add.Chunk})
		case actors.Send:
			send(trace.Chunk, trace.ChunkID(e.To), e.Msg)
		case actors.StopChunk:
			send(trace.Forward, "forward", &messages.Forget{Chunk: e.Chunk})
			delete(r.chunks, trace.ChunkID(e.Chunk))
			r.stopped[trace.ChunkID(e.Chunk)] = true
		case actors.Idle:
			room, _ := strconv.ParseUint(rec.ID, 10, 64)
			send(trace.Manager, "manager", &messages.RoomIdle{Room: room, Seen: e.Seen})
		case actors.FanOut:
			for _, t := range e.To {
				send(trace.Chunk, trace.ChunkID(t.Chunk), e.Msg)
			}
		case actors.Submit:
			send(trace.Submitter, "*", &trace.Work{Work: e.Work, Job: e.Work.Chunk}) // the chunk shell attaches the job
		case actors.ChunkEnded:
			res := e.Result
			send(trace.Room, strconv.FormatUint(res.Chunk.Room, 10), &messages.ChunkDone{Result: res})
			cr := ChunkResult{Chunk: trace.ChunkID(res.Chunk), Status: res.Status.String()}
			if res.Err != nil {
				cr.Err = res.Err.Error()
			}
			r.out.Results = append(r.out.Results, cr)
			r.out.Statuses[cr.Status]++
		}
		if b, ok := e.(actors.FanOut); ok {
			if _, begin := b.Msg.(*messages.Bind); begin {
				r.out.Forwards++
			}
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// String summarizes an outcome in a few lines.
func (o *Outcome) String() string {
	var b strings.Builder
	var st []string
	for k, v := range o.Statuses {
		st = append(st, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(st)
	fmt.Fprintf(&b, "%d records: %d rooms, %d chunks, %d forwards; chunk statuses: %s", o.Records, o.Rooms, o.Chunks, o.Forwards, strings.Join(st, ", "))
	if o.Skipped > 0 {
		fmt.Fprintf(&b, "\n%d records skipped: the trace's ring dropped their actors' beginnings", o.Skipped)
	}
	if o.Divergence != nil {
		fmt.Fprintf(&b, "\n%s", o.Divergence)
	} else {
		fmt.Fprintf(&b, "\nreplayed %d messages, no divergence", o.Replayed)
	}
	return b.String()
}
