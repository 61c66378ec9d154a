package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/decode"
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
	// Registrations counts the recorded Register calls.
	Registrations int
	// InFlight counts the messages the replayed actors sent that the trace
	// never shows handled: in mailboxes when the engine stopped its actors,
	// or when the trace was taken.
	InFlight int
	// InFlightMessages names the first MaxExcerptLines of them, oldest
	// first: "to room/1, sent by chunk/1:0-8#1 at record 24: ChunkDone
	// {...}".
	InFlightMessages []string
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
	// Decode is what a decode server's replay decided (DecodeCore), nil
	// for an engine's trace; Summary then holds its records, messages
	// replayed and revocations in flight only.
	Decode     *decode.ReplayOutcome
	Divergence *Divergence
}

// inbox holds the messages the replayed actors sent one actor and it has
// not handled yet, in the order they were sent, each with its sender (the
// record whose effects sent it).
type inbox struct {
	lines   []string
	msgs    []any
	senders []string
	sentBy  []uint64 // the sending record's seq
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
	// stopped are the chunks that ended: a chunk stops as it ends, so a
	// record of one handling a message afterwards is a divergence.
	stopped map[string]bool
	// worked counts the Work submitters handled whose wait has not ended
	// (no Waited yet), by chunk, group and destination.
	worked map[workKey]int
	// lastSeq is the previous record's number: records come numbered one
	// after the other.
	lastSeq uint64
	// peers are the decode peers the recorded AddPeer calls added, and
	// registered the plans the recorded registrations built, by chunk,
	// until the manager's AddChunk for it: a replay builds each chunk's
	// plan from its registration, as the engine does, and checks the
	// AddChunk against it.
	peers      map[string]*plan.Peer
	peerSeqs   []string // "id at record n", for divergences
	registered map[string]registration
	plans      map[string]*plan.Plan // AddChunk handled, until SpawnChunk
	lost       map[string]uint64     // chunks of registrations that lost a race (their record), until their room answers

	// What the replay saw begin, for a trace whose ring dropped records
	// (header dropped > 0): records about anything else (a room spawned,
	// a chunk spawned, a forward begun, a peer added or removed before the
	// trace's first record) are skipped, since their beginning is not in
	// the trace. Unused for a whole trace.
	rooms0    map[uint64]bool // SpawnRoom replayed
	chunks0   map[string]bool // SpawnChunk replayed
	forwards0 map[uint64]bool // Begin replayed
	peers0    map[string]bool // AddPeerCall or RemovePeerCall replayed
	// peerLive counts the live chunks (spawned, not ended) per peer they
	// send to, for a RemovePeerCall's check.
	peerLive map[string]int
	// chunkPeers are the peers of each live chunk's real destinations.
	chunkPeers map[string][]string
}

// workKey names one Work: its chunk, group (or Rest) and destination.
type workKey struct {
	chunk     string
	seq, dest int
}

// registration is a recorded registration awaiting its AddChunk.
type registration struct {
	seq  uint64
	line int
	plan *plan.Plan
	// lost: the registration lost a race with a concurrent one of its key;
	// its AddChunk must find the winner's chunk queued (no SpawnChunk).
	lost bool
	// peers are its real destinations' peers, which its AddChunk lists.
	peers []string
}

// Cores replays a trace through fresh functional cores, one record at a
// time: it holds the replayed actors' state, never the trace. The header
// is validated before anything is allocated from it, and every record
// comes checked against it (trace.Stream); stream errors end the replay.
// A decode server's trace (header side "decode") is replayed through a
// decode core (DecodeCore).
func Cores(s trace.Stream) (*Outcome, error) {
	h := s.Header()
	if h.Side == trace.SideDecode {
		return DecodeCore(s)
	}
	l, err := Layout(h.Config)
	if err != nil {
		return nil, err
	}
	r := &replayer{header: h, layout: l, out: &Outcome{Summary: Summary{Statuses: map[string]int{}}},
		manager: actors.NewManagerCore(), forward: actors.NewForwardCore(),
		rooms: map[uint64]*actors.RoomCore{}, chunks: map[string]*actors.ChunkCore{}, inboxes: map[string]*inbox{}, seen: map[string]bool{}, stopped: map[string]bool{}, worked: map[workKey]int{},
		peers: map[string]*plan.Peer{}, registered: map[string]registration{}, plans: map[string]*plan.Plan{},
		lost: map[string]uint64{}, rooms0: map[uint64]bool{}, chunks0: map[string]bool{}, forwards0: map[uint64]bool{}, peers0: map[string]bool{},
		peerLive: map[string]int{}, chunkPeers: map[string][]string{}}
	if h.Dropped > 0 {
		// The ring overwrote the first records: the trace starts at
		// Dropped+1.
		r.lastSeq = h.Dropped
	}
	for {
		rec, err := s.Next()
		if err == io.EOF {
			r.out.Divergence = r.atEnd()
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
	if err != nil {
		return nil, errors.Wrap(err, "trace header")
	}
	if sh := c.Sharding; sh != nil {
		if err := l.SetSharding(&plan.Sharding{Side: sh.Side, Rank: sh.Rank}, reshard.ReplicaRule(c.Replicas)); err != nil {
			return nil, errors.Wrap(err, "trace header: sharding")
		}
	}
	return l, nil
}

// Policy is the per-layer policy a trace's engine ran under.
func Policy(c trace.Config) cp.Policy {
	switch {
	case !c.PerLayer:
		return cp.NoPerLayer
	case c.SingleDestination:
		return cp.SingleDestination
	}
	return cp.EveryDestination
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
		// A Submitted is sent by a submitter's resume, recorded as its
		// Waited (whose effect it is): internal.
		switch typ {
		case "BatchDone", "Timeout", "TornDown", "Quiesced", "BatchOverdue", "Cancel":
			return true
		}
	case trace.Submitter:
		return typ == "Waited"
	}
	return false
}

func key(kind, id string) string { return kind + "/" + id }

func (r *replayer) step(rec *trace.Record) (*Divergence, error) {
	div := func(reason string, recorded, replayed []string) *Divergence {
		return &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: reason, Recorded: recorded, Replayed: replayed}
	}
	// Records are numbered as actors begin handling messages, one after
	// the other: a gap is a record missing, a number out of order one
	// moved, repeated or renumbered.
	switch want := r.lastSeq + 1; {
	case rec.Seq == want:
	case rec.Seq > want:
		return div(fmt.Sprintf("record %d follows record %d: %s missing", rec.Seq, r.lastSeq, missing(want, rec.Seq-1)), []string{fmt.Sprintf("seq %d", want)}, []string{fmt.Sprintf("seq %d", rec.Seq)}), nil
	default:
		return div(fmt.Sprintf("record %d follows record %d: records are numbered one after the other (repeated, moved or renumbered)", rec.Seq, r.lastSeq), []string{fmt.Sprintf("seq %d", want)}, []string{fmt.Sprintf("seq %d", rec.Seq)}), nil
	}
	r.lastSeq = rec.Seq
	// One engine, one manager, one forward actor: their ids are fixed.
	switch rec.Actor {
	case trace.Engine, trace.Manager, trace.Forward:
		if rec.ID != rec.Actor {
			return div(fmt.Sprintf("actor %s is named %q, not %q", rec.Actor, trace.Excerpt(rec.ID, 64), rec.Actor), []string{rec.ID}, []string{rec.Actor}), nil
		}
	}
	if rec.Actor == trace.Engine {
		return r.call(rec)
	}
	if rec.Actor == trace.Submitter {
		if n, err := strconv.Atoi(rec.ID); err != nil || n < 0 || n >= r.header.Config.Submitters {
			return div(fmt.Sprintf("submitter %q: want one of the header's %d submitters", trace.Excerpt(rec.ID, 64), r.header.Config.Submitters), []string{rec.ID}, nil), nil
		}
	}
	if r.header.Dropped > 0 {
		skip, err := r.cut(rec)
		if err != nil {
			return nil, err
		}
		if skip {
			r.out.Skipped++ // its beginning was overwritten in the ring
			return nil, nil
		}
	}
	if rec.Actor == trace.Submitter && rec.Type == "Waited" {
		return r.waited(rec)
	}
	var msg any
	if external(rec.Actor, rec.Type) {
		m, err := trace.Decode(rec)
		if err != nil {
			return nil, errors.Wrapf(err, "%s", rec.Where())
		}
		msg = m
		if add, ok := m.(*messages.AddChunk); ok {
			if r.header.Dropped > 0 {
				if _, ok := r.registered[trace.ChunkID(add.Chunk)]; !ok && !r.rooms0[add.Chunk.Room] {
					// Its registration came before the trace's first
					// record (or was skipped, naming a peer added before
					// it): the room is replayed from a spawn whose
					// registrations the trace holds.
					r.out.Skipped++
					return nil, nil
				}
			}
			if d := r.addChunk(rec, add); d != nil {
				return d, nil
			}
		}
		if b, ok := m.(*messages.Begin); ok && r.header.Dropped > 0 {
			r.forwards0[b.Forward] = true
			if err := r.primeBegin(rec); err != nil {
				return nil, err
			}
		}
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
		// A mailbox delivers one sender's messages in the order it sent
		// them (the submitters' router spreads Work over several
		// mailboxes, so theirs is not checked).
		if found > 0 && rec.Actor != trace.Submitter {
			for i := range found {
				if box.senders[i] == box.senders[found] {
					return div(fmt.Sprintf("handled before a message its sender (%s, record %d) sent it earlier: a mailbox keeps its sender's order", box.senders[i], box.sentBy[i]),
						[]string{want}, box.lines[:found+1]), nil
				}
			}
		}
		if found < 0 && r.header.Dropped > 0 && rec.Actor == trace.Forward && (rec.Type == "Pending" || rec.Type == "Forget") {
			// A chunk spawned before the trace's first record tells the
			// forward actor it waits for a forward, or that it ended: fed
			// as recorded, so that the forward actor's fan-outs stay those
			// recorded.
			if c, err := trace.ParseChunkID(msgString(rec.Msg, "Chunk")); err == nil && !r.chunks0[trace.ChunkID(c)] {
				if rec.Type == "Pending" {
					r.forward.Step(&messages.Pending{Chunk: c})
				} else {
					r.forward.Step(&messages.Forget{Chunk: c})
				}
				if len(rec.Effects) > 0 {
					return div("the forward actor's effects differ from the recorded ones", rec.Effects, nil), nil
				}
				r.out.Skipped++
				return nil, nil
			}
		}
		if found < 0 {
			var pending []string
			if box != nil {
				for i, l := range box.lines {
					pending = append(pending, fmt.Sprintf("%s (sent by %s, record %d)", l, box.senders[i], box.sentBy[i]))
				}
			}
			return div("the recording shows this message handled, but the replayed actors never sent it (replayed lines: what they sent this actor and it has not handled)",
				[]string{want}, pending), nil
		}
		msg = box.msgs[found]
		box.lines = append(box.lines[:found:found], box.lines[found+1:]...)
		box.msgs = append(box.msgs[:found:found], box.msgs[found+1:]...)
		box.senders = append(box.senders[:found:found], box.senders[found+1:]...)
		box.sentBy = append(box.sentBy[:found:found], box.sentBy[found+1:]...)
	}
	r.out.Replayed++
	if rec.Actor == trace.Submitter {
		// A submitter has no core; the Work matched. Its wait's end is
		// its Waited record.
		if w, ok := msg.(*trace.Work); ok {
			r.worked[workKey{trace.ChunkID(w.Chunk), w.Seq, w.Dest}]++
		}
		return nil, nil
	}
	effs, d := r.feed(rec, msg)
	if d != nil {
		return d, nil
	}
	got := trace.Effects(effs)
	if !equal(got, rec.Effects) {
		return div("the replayed core's effects differ from the recorded ones", rec.Effects, got), nil
	}
	if add, ok := msg.(*messages.AddChunk); ok && rec.Actor == trace.Room {
		id := trace.ChunkID(add.Chunk)
		if seq, lost := r.lost[id]; lost {
			delete(r.lost, id)
			for _, e := range effs {
				if _, spawn := e.(actors.SpawnChunk); spawn {
					return div(fmt.Sprintf("the registration at record %d lost a race with one of its key (its outcome: the chunk existed), but its room added its chunk", seq), rec.Effects, nil), nil
				}
			}
			delete(r.plans, id) // no chunk spawned: its plan goes
		}
	}
	r.route(rec, effs)
	return nil, nil
}

// waited takes a submitter's Waited: the wait of a Work it handled ended,
// and its effect, the Submitted it sent the chunk, is delivered to the
// chunk's inbox like any message an actor sent.
func (r *replayer) waited(rec *trace.Record) (*Divergence, error) {
	div := func(reason string, recorded, replayed []string) *Divergence {
		return &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: reason, Recorded: recorded, Replayed: replayed}
	}
	var w trace.Waited
	if err := trace.Remarshal(rec.Msg, &w); err != nil {
		return nil, errors.Wrapf(err, "%s", rec.Where())
	}
	k := workKey{w.Chunk, w.Seq, w.Dest}
	if r.worked[k] == 0 {
		if r.header.Dropped > 0 {
			r.out.Skipped++
			return nil, nil
		}
		return div(fmt.Sprintf("a wait ended for chunk %s group %d destination %d, whose Work no submitter handled", trace.Excerpt(w.Chunk, 64), w.Seq, w.Dest), []string{trace.Canonical(rec.Msg)}, nil), nil
	}
	r.worked[k]--
	if len(rec.Effects) != 1 {
		return div("a Waited sends its chunk exactly one Submitted", rec.Effects, nil), nil
	}
	name, body, _ := strings.Cut(rec.Effects[0], " ")
	var fields any
	if name != "Submitted" || trace.Unmarshal(body, &fields) != nil {
		return div("a Waited's effect is the Submitted it sent its chunk", rec.Effects, nil), nil
	}
	sub := trace.Record{Seq: rec.Seq, Line: rec.Line, Actor: trace.Chunk, ID: w.Chunk, Type: "Submitted", Msg: fields}
	msg, err := trace.Decode(&sub)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", rec.Where())
	}
	if s := msg.(*messages.Submitted); s.Seq != w.Seq || s.Dest != w.Dest {
		return div(fmt.Sprintf("the Waited is for group %d destination %d; the Submitted it sent names group %d destination %d", w.Seq, w.Dest, s.Seq, s.Dest), rec.Effects, nil), nil
	}
	r.deliver(key(trace.Chunk, w.Chunk), key(rec.Actor, rec.ID), rec.Seq, "Submitted "+trace.Canonical(fields), msg)
	r.out.Replayed++
	return nil, nil
}

// deliver puts a message an actor sent into its receiver's inbox.
func (r *replayer) deliver(to, from string, seq uint64, line string, msg any) {
	if r.header.Dropped > 0 && !r.whole(to) {
		return // an actor whose beginning was dropped: its records are skipped
	}
	r.seen[to] = true
	b := r.inboxes[to]
	if b == nil {
		b = &inbox{}
		r.inboxes[to] = b
	}
	b.lines = append(b.lines, line)
	b.msgs = append(b.msgs, msg)
	b.senders = append(b.senders, from)
	b.sentBy = append(b.sentBy, seq)
}

// missing names the records from..to.
func missing(from, to uint64) string {
	if from == to {
		return fmt.Sprintf("record %d is", from)
	}
	return fmt.Sprintf("records %d to %d are", from, to)
}

// call takes a façade call's record: the peers AddPeer added, and the plan
// each registration built, which the manager's AddChunk for its chunk must
// carry and its chunk core is given.
func (r *replayer) call(rec *trace.Record) (*Divergence, error) {
	div := func(reason string, recorded, replayed []string) *Divergence {
		return &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: reason, Recorded: recorded, Replayed: replayed}
	}
	c, err := r.header.Config.DecodeCall(rec)
	if err != nil {
		return nil, err
	}
	switch call := c.(type) {
	case *trace.AddPeerCall:
		r.peerSeqs = append(r.peerSeqs, fmt.Sprintf("%s at record %d", call.ID, rec.Seq))
		if call.Err != "" {
			r.peerSeqs[len(r.peerSeqs)-1] += " (refused)"
			return nil, nil
		}
		if _, ok := r.peers[call.ID]; ok {
			return div(fmt.Sprintf("the recorded AddPeer of %s succeeded, but the peer was added already and not removed (the engine refuses an id it has): %s", call.ID, r.peerRecords()),
				[]string{"AddPeer " + call.ID + ": ok"}, []string{"AddPeer " + call.ID + ": refused, already added"}), nil
		}
		p, err := plan.ResolvePeer(r.layout, recordedPeer(call))
		if err != nil {
			return div("the recorded AddPeer succeeded; the replayed layout refuses the peer", []string{"AddPeer " + call.ID + ": ok"}, []string{err.Error()}), nil
		}
		r.peers[call.ID] = p
		r.peers0[call.ID] = true
	case *trace.RemovePeerCall:
		if call.Err != "" {
			return nil, nil
		}
		if _, ok := r.peers[call.ID]; !ok {
			if r.header.Dropped > 0 && !r.peers0[call.ID] {
				r.peers0[call.ID] = true // added before the trace's first record; removed now
				r.out.Skipped++
				return nil, nil
			}
			return div(fmt.Sprintf("the recorded RemovePeer of %s succeeded, but no such peer is added (the engine refuses an unknown id): %s", call.ID, r.peerRecords()),
				[]string{"RemovePeer " + call.ID + ": ok"}, []string{"RemovePeer " + call.ID + ": refused, unknown peer"}), nil
		}
		if n := r.peerLive[call.ID]; n > 0 {
			var live []string
			for c, peers := range r.chunkPeers {
				if slices.Contains(peers, call.ID) {
					live = append(live, c)
				}
			}
			sort.Strings(live)
			return div(fmt.Sprintf("the recorded RemovePeer of %s succeeded, but %d live chunks send to it (the engine removes a peer once none does)", call.ID, n),
				[]string{"RemovePeer " + call.ID + ": ok"}, append([]string{"RemovePeer " + call.ID + ": refused, live chunks:"}, live...)), nil
		}
		delete(r.peers, call.ID)
		r.peerSeqs = append(r.peerSeqs, fmt.Sprintf("%s removed at record %d", call.ID, rec.Seq))
	case *trace.RegisterCall:
		r.out.Registrations++
		// A registration handed its chunk to the manager when it was
		// begun with a new chunk and built a plan: it succeeded, or it lost
		// a race with a concurrent registration of its key (Existing, or
		// refused against the winner's spec) while its AddChunk, with its
		// own serial, still went to the manager, whose room answered
		// Existing. One found registered at once names the existing chunk
		// and built no plan.
		handedOff := call.Chunk != "" && ((!call.Existing && call.Err == "") || call.Plan != 0)
		if !handedOff {
			return nil, nil // no chunk added for it
		}
		chunk, err := trace.ParseChunkID(call.Chunk)
		if err != nil {
			return nil, errors.Wrapf(err, "%s", rec.Where())
		}
		if r.header.Dropped > 0 {
			for _, in := range call.Infos {
				if !in.Dummy && !r.peers0[in.Peer] {
					r.out.Skipped++ // its peer was added before the trace's first record
					return nil, nil
				}
			}
		}
		p, err := plan.BuildPlan(r.layout, r.peer, specOf(call), Policy(r.header.Config))
		if err != nil {
			return div("the recorded registration added a chunk; the replayed plan refuses it (its pages or peers differ from what the engine had: "+r.peerRecords()+")",
				[]string{"Register " + call.Chunk + ": ok"}, []string{err.Error()}), nil
		}
		if len(rec.Effects) > 0 && ((call.PerLayer != (p.Mode == cp.PerLayer) && !call.Existing && call.Err == "") || call.Plan != p.Digest()) {
			return div("the replayed plan differs from the one the recorded registration built (its pages, peers or mode)", rec.Effects,
				[]string{fmt.Sprintf("per layer %v (%s), plan %d", p.Mode == cp.PerLayer, p.Reason, p.Digest())}), nil
		}
		if k := chunk.ChunkKey; k.Room != call.Room || k.Start != call.Start {
			return div(fmt.Sprintf("the registration names chunk %s but registers room %d from token %d", call.Chunk, call.Room, call.Start), []string{call.Chunk}, nil), nil
		}
		p.Chunk = chunk
		r.registered[call.Chunk] = registration{seq: rec.Seq, line: rec.Line, plan: p, lost: call.Existing || call.Err != "", peers: realPeers(call)}
	}
	return nil, nil
}

// peerRecords lists the peers the recorded AddPeer calls named, with their
// records.
func (r *replayer) peerRecords() string {
	if len(r.peerSeqs) == 0 {
		return "no peer was added"
	}
	return "peers added: " + strings.Join(r.peerSeqs, ", ")
}

func (r *replayer) peer(id string) (*plan.Peer, bool) {
	p, ok := r.peers[id]
	return p, ok
}

// recordedPeer is a peer of the recorded geometry; its addresses and keys
// are stand-ins (a plan needs their sizes, not their values).
func recordedPeer(call *trace.AddPeerCall) plan.Peer {
	p := plan.Peer{ID: call.ID, Address: []byte(call.ID)}
	for i, pages := range call.Pages {
		var item uint64
		if i < len(call.ItemLen) {
			item = call.ItemLen[i]
		}
		p.Buffers = append(p.Buffers, plan.PeerBuffer{Region: rdma.RegionDesc{Addr: uint64(i+1) << 40, Len: item * uint64(pages), Key: []byte{1}}, ItemLen: item})
	}
	if call.Sharding != nil {
		p.Sharding = &plan.Sharding{Side: call.Sharding.Side, Rank: call.Sharding.Rank}
	}
	return p
}

// specOf is a recorded registration as the engine received it.
func specOf(call *trace.RegisterCall) *plan.ChunkSpec {
	s := &plan.ChunkSpec{Room: call.Room, Start: call.Start, End: call.End, Last: call.Last, SrcPages: call.SrcPages, TotalPages: call.TotalPages}
	for _, in := range call.Infos {
		s.Infos = append(s.Infos, plan.DecodeInfo{Peer: in.Peer, DstPages: in.DstPages, Dummy: in.Dummy})
	}
	return s
}

// addChunk checks the manager's AddChunk against the plan its recorded
// registration built.
func (r *replayer) addChunk(rec *trace.Record, m *messages.AddChunk) *Divergence {
	id := trace.ChunkID(m.Chunk)
	got := fmt.Sprintf("AddChunk %s: per layer %v, %d pages owned, %d destinations, peers %q", id, m.PerLayer, m.Owned, m.Dests, m.Peers)
	reg, ok := r.registered[id]
	if !ok {
		reason := "the manager added a chunk no recorded registration built (its RegisterCall is missing)"
		for other, o := range r.registered {
			if c, err := trace.ParseChunkID(other); err == nil && c.Room == m.Chunk.Room && c.Start == m.Chunk.Start {
				reason = fmt.Sprintf("the manager added chunk %s; the registration at record %d built chunk %s", id, o.seq, other)
			}
		}
		return &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: reason, Recorded: []string{got}}
	}
	delete(r.registered, id)
	p := reg.plan
	want := fmt.Sprintf("AddChunk %s: per layer %v, %d pages owned, %d destinations, peers %q", id, p.Mode == cp.PerLayer, p.Owned, len(p.Dests), reg.peers)
	if got != want {
		return &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type,
			Reason: fmt.Sprintf("the chunk differs from the plan of its registration (record %d)", reg.seq), Recorded: []string{got}, Replayed: []string{want}}
	}
	r.plans[id] = p
	if reg.lost {
		r.lost[id] = reg.seq
	}
	return nil
}

// realPeers are the decode peers of a registration's real destinations,
// as the engine lists them in its AddChunk: the infos' order, once each.
func realPeers(call *trace.RegisterCall) []string {
	var out []string
	for _, in := range call.Infos {
		if !in.Dummy && !slices.Contains(out, in.Peer) {
			out = append(out, in.Peer)
		}
	}
	return out
}

// atEnd checks what the trace left: as many records as its header says
// (a record missing at the end leaves no gap), and every chunk a
// registration built added. Messages sent and not handled are counted: an
// engine stops its actors at Close with messages in their mailboxes, and a
// trace taken while it runs has messages in flight; one handled out of its
// sender's order was caught when it was.
func (r *replayer) atEnd() *Divergence {
	type flight struct {
		seq  uint64
		line string
	}
	var fl []flight
	for to, b := range r.inboxes {
		r.out.InFlight += len(b.lines)
		for i, l := range b.lines {
			fl = append(fl, flight{b.sentBy[i], fmt.Sprintf("to %s, sent by %s at record %d: %s", to, b.senders[i], b.sentBy[i], l)})
		}
	}
	sort.Slice(fl, func(i, j int) bool { return fl[i].seq < fl[j].seq || fl[i].seq == fl[j].seq && fl[i].line < fl[j].line })
	for i, f := range fl {
		if i == MaxExcerptLines {
			break
		}
		r.out.InFlightMessages = append(r.out.InFlightMessages, f.line)
	}
	if h := r.header; h.Records > 0 && r.out.Records != h.Records {
		reason := fmt.Sprintf("the header says the trace holds %d records; it holds %d, the last being record %d", h.Records, r.out.Records, r.lastSeq)
		if last := h.Dropped + uint64(h.Records); r.out.Records < h.Records && last > r.lastSeq {
			reason += ": " + missing(r.lastSeq+1, last) + " missing"
		}
		return &Divergence{Seq: r.lastSeq, Actor: trace.Engine, ID: "trace", Reason: reason}
	}
	var first *registration
	var id string
	for k, reg := range r.registered {
		if first == nil || reg.seq < first.seq {
			reg := reg
			first, id = &reg, k
		}
	}
	if first != nil {
		return &Divergence{Seq: first.seq, Line: first.line, Actor: trace.Engine, ID: "engine", Type: "RegisterCall",
			Reason: fmt.Sprintf("at the end of the trace: the registration of chunk %s built a chunk the manager never added (its AddChunk record is missing)", id)}
	}
	return nil
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
			return nil, &Divergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type,
				Reason: "the chunk handled a message after it ended: a chunk stops as it ends, and what reaches it later is dropped unhandled"}
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
	from := key(rec.Actor, rec.ID)
	send := func(kind, id string, msg any) {
		r.deliver(key(kind, id), from, rec.Seq, trace.TypeName(msg)+" "+trace.Canonical(trace.Encode(msg)), msg)
	}
	for _, e := range effs {
		switch e := e.(type) {
		case actors.SpawnRoom:
			r.rooms0[e.Room] = true
			r.rooms[e.Room] = actors.NewRoomCore(e.Room)
			r.out.Rooms++
			r.seen[key(trace.Room, strconv.FormatUint(e.Room, 10))] = true
		case actors.Route:
			send(trace.Room, strconv.FormatUint(e.Room, 10), e.Msg)
		case actors.StopRoom:
			delete(r.rooms, e.Room)
		case actors.SpawnChunk:
			id := trace.ChunkID(e.Add.Chunk)
			p := r.plans[id] // addChunk checked it against the AddChunk
			delete(r.plans, id)
			if p == nil {
				p = &plan.Plan{Chunk: e.Add.Chunk, Owned: e.Add.Owned, Dests: make([]plan.Dest, e.Add.Dests)}
				if e.Add.PerLayer {
					p.Mode = cp.PerLayer
				}
			}
			r.chunks0[id] = true
			r.chunkPeers[id] = e.Add.Peers
			for _, peer := range e.Add.Peers {
				r.peerLive[peer]++
			}
			r.chunks[id] = actors.NewChunkCore(r.layout, p)
			r.out.Chunks++
			r.seen[key(trace.Chunk, id)] = true
			send(trace.Forward, "forward", &messages.Pending{Chunk: e.Add.Chunk})
		case actors.Send:
			send(trace.Chunk, trace.ChunkID(e.To), e.Msg)
		case actors.StopChunk:
			// The chunk stopped at its ChunkEnded.
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
			id := trace.ChunkID(res.Chunk)
			r.stopped[id] = true // the chunk stops as it ends
			delete(r.chunks, id)
			for _, peer := range r.chunkPeers[id] {
				if r.peerLive[peer]--; r.peerLive[peer] <= 0 {
					delete(r.peerLive, peer)
				}
			}
			delete(r.chunkPeers, id)
			if e.Forget {
				send(trace.Forward, "forward", &messages.Forget{Chunk: res.Chunk})
			}
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
	if o.Decode != nil {
		return o.decodeString()
	}
	var b strings.Builder
	st := sortedCounts(o.Statuses)
	fmt.Fprintf(&b, "%d records: %d rooms, %d chunks, %d forwards; chunk statuses: %s", o.Records, o.Rooms, o.Chunks, o.Forwards, st)
	if o.Skipped > 0 {
		fmt.Fprintf(&b, "\n%d records skipped: the trace's ring dropped their actors' beginnings", o.Skipped)
	}
	if o.InFlight > 0 {
		// Not a divergence by itself (an engine stops its actors at Close
		// with messages in their mailboxes, a trace taken while it runs
		// has messages in flight), but never silent: a lost message shows
		// here, and a person decides.
		fmt.Fprintf(&b, "\n%d messages sent and never handled (in mailboxes when the actors stopped, in flight when the trace was taken, or lost):", o.InFlight)
		for _, l := range o.InFlightMessages {
			fmt.Fprintf(&b, "\n  %s", trace.Excerpt(l, MaxExcerpt))
		}
		if n := o.InFlight - len(o.InFlightMessages); n > 0 {
			fmt.Fprintf(&b, "\n  … and %d more", n)
		}
	}
	if o.Divergence != nil {
		fmt.Fprintf(&b, "\n%s", o.Divergence)
	} else {
		fmt.Fprintf(&b, "\nreplayed %d messages, no divergence", o.Replayed)
	}
	return b.String()
}

// sortedCounts lists counts by name: "a 1, b 2".
func sortedCounts(m map[string]int) string {
	var st []string
	for k, v := range m {
		st = append(st, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(st)
	return strings.Join(st, ", ")
}

// cut reports whether a record of a trace whose ring dropped records is
// about something whose beginning was dropped: a room or a chunk spawned
// before the trace's first record, a forward begun before it, a submitter's
// Work or wait for such a chunk, or the manager's call or report for such a
// room. Such a record is skipped; what began in the trace replays whole.
func (r *replayer) cut(rec *trace.Record) (bool, error) {
	switch rec.Actor {
	case trace.Room:
		room, err := strconv.ParseUint(rec.ID, 10, 64)
		return err == nil && !r.rooms0[room], nil
	case trace.Chunk:
		return !r.chunks0[rec.ID], nil
	case trace.Submitter:
		c, err := trace.ParseChunkID(msgString(rec.Msg, "Chunk"))
		return err == nil && !r.chunks0[trace.ChunkID(c)], nil
	case trace.Manager:
		switch rec.Type {
		case "AddChunk":
			c, err := trace.ParseChunkID(msgString(rec.Msg, "Chunk"))
			if err != nil || r.rooms0[c.Room] {
				return false, nil
			}
			// A room unknown to the replay is replayed from its spawn: an
			// AddChunk is skipped when the recording shows it routed to
			// the room as to one that exists, and nothing else.
			m, err := trace.Decode(rec)
			if err != nil {
				return false, errors.Wrapf(err, "%s", rec.Where())
			}
			if !equal(rec.Effects, trace.Effects([]any{actors.Route{Room: c.Room, Msg: m}})) {
				return false, nil
			}
			delete(r.registered, trace.ChunkID(c))
			return true, nil
		case "Finish", "Drop", "RoomIdle":
			room, ok := msgUint(rec.Msg, "Room")
			return ok && !r.rooms0[room], nil
		}
	case trace.Forward:
		switch rec.Type {
		case "Boundary", "End":
			f, ok := msgUint(rec.Msg, "Forward")
			return ok && !r.forwards0[f], nil
		}
	}
	return false, nil
}

// whole says whether an inbox's actor began in a trace whose ring dropped
// records (the manager, the forward actor and the submitters always did).
func (r *replayer) whole(to string) bool {
	kind, id, _ := strings.Cut(to, "/")
	switch kind {
	case trace.Chunk:
		return r.chunks0[id]
	case trace.Room:
		room, err := strconv.ParseUint(id, 10, 64)
		return err == nil && r.rooms0[room]
	}
	return true
}

// primeBegin gives the forward core, before a Begin of a trace whose ring
// dropped records, the pending chunks the recording shows it binding when
// some of them were spawned before the trace's first record: the chunks
// whose spawn the trace holds must be pending in the same order, or the
// effects differ (a divergence). Nothing is primed otherwise.
func (r *replayer) primeBegin(rec *trace.Record) error {
	var bound []string
	for _, e := range rec.Effects {
		name, body, _ := strings.Cut(e, " ")
		if name != "FanOut" {
			continue
		}
		var f struct {
			Msg struct{ Type string }
			To  []struct{ Chunk string }
		}
		if err := json.Unmarshal([]byte(body), &f); err != nil || f.Msg.Type != "Bind" {
			continue
		}
		for _, t := range f.To {
			bound = append(bound, t.Chunk)
		}
	}
	var known, unknown []string
	for _, id := range bound {
		if r.chunks0[id] {
			known = append(known, id)
		} else {
			unknown = append(unknown, id)
		}
	}
	pending := r.forward.Pending()
	var whole []string
	for _, c := range pending {
		if id := trace.ChunkID(c); r.chunks0[id] {
			whole = append(whole, id)
		}
	}
	if len(unknown) == 0 || !slices.Equal(whole, known) {
		return nil
	}
	for _, c := range pending {
		r.forward.Step(&messages.Forget{Chunk: c})
	}
	for _, id := range bound {
		c, err := trace.ParseChunkID(id)
		if err != nil {
			return errors.Wrapf(err, "%s", rec.Where())
		}
		r.forward.Step(&messages.Pending{Chunk: c})
	}
	return nil
}

// msgString is a recorded message's string field ("" if none).
func msgString(msg any, field string) string {
	m, _ := msg.(map[string]any)
	s, _ := m[field].(string)
	return s
}

// msgUint is a recorded message's unsigned integer field.
func msgUint(msg any, field string) (uint64, bool) {
	m, _ := msg.(map[string]any)
	switch v := m[field].(type) {
	case json.Number:
		n, err := strconv.ParseUint(v.String(), 10, 64)
		return n, err == nil
	case float64:
		return uint64(v), v >= 0
	case uint64:
		return v, true
	case int:
		return uint64(v), v >= 0
	}
	return 0, false
}
