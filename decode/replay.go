package decode

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode/internal/core"
	"github.com/kvstream/kvstream/trace"
)

// ReplayOutcome is what the replay of a decode trace found: a summary of
// what the replayed core decided, and the first divergence from the
// recording, if any.
type ReplayOutcome struct {
	// Records is how many records the replay read: the whole trace, or up
	// to the first divergence.
	Records int
	// Replayed counts the messages stepped into the core.
	Replayed int
	// Sessions counts the sessions the core opened; SessionsEnded the
	// sessions that ended, by outcome (complete, failed, aborted, lost,
	// closed, empty).
	Sessions      int
	SessionsEnded map[string]int
	// Rooms are the rooms that ended, in the order they did.
	Rooms []RoomOutcome
	// InFlight counts the revocations the core asked for whose outcome the
	// trace does not show: under way when it was taken.
	InFlight   int
	Divergence *ReplayDivergence
}

// RoomOutcome is one room's end in a replay: its outcome (complete,
// failed, dropped, lost, aborted, timeout, released, closed, verify,
// bad_input) and its error's text.
type RoomOutcome struct {
	Room    uint64
	Outcome string
	Err     string
}

// ReplayDivergence is the first record where a replay differs from the
// recording: the record (its number and line), its actor and message type,
// why, and both sides (whole: whoever prints them bounds them, as package
// lab/replay's divergences do).
type ReplayDivergence struct {
	Seq      uint64
	Line     int
	Actor    string
	ID       string
	Type     string
	Reason   string
	Recorded []string
	Replayed []string
}

// String renders a replay's summary in a few lines (the divergence by its
// reason only: lab/replay prints its sides in bounded excerpts).
func (o *ReplayOutcome) String() string {
	var b strings.Builder
	byOutcome := map[string]int{}
	for _, r := range o.Rooms {
		byOutcome[r.Outcome]++
	}
	fmt.Fprintf(&b, "%d records: %d sessions (ended: %s), %d rooms ended (%s)", o.Records, o.Sessions, counts(o.SessionsEnded), len(o.Rooms), counts(byOutcome))
	if o.InFlight > 0 {
		fmt.Fprintf(&b, "; %d revocations under way when the trace was taken", o.InFlight)
	}
	if d := o.Divergence; d != nil {
		fmt.Fprintf(&b, "\ndivergence at record %d (%s %s handling %s): %s", d.Seq, trace.Excerpt(d.Actor, 64), trace.Excerpt(d.ID, 64), trace.Excerpt(d.Type, 64), trace.Excerpt(d.Reason, 1024))
	} else {
		fmt.Fprintf(&b, "\nreplayed %d messages, no divergence", o.Replayed)
	}
	return b.String()
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(out, ", ")
}

// pendingCall is a Call the core returned, whose result the shell steps in
// before anything else (Server.drive).
type pendingCall struct {
	result string // the message type that answers it
	seq    uint64 // the record that returned it
	line   string // the Call, as recorded
}

// callResult names the message that answers a Call effect.
func callResult(e core.Effect) (string, bool) {
	switch e.(type) {
	case core.CallAdmit:
		return "AdmittedMsg", true
	case core.CallSize:
		return "SizedMsg", true
	case core.CallOpenAccess:
		return "AccessMsg", true
	case core.CallVerify:
		return "VerifiedMsg", true
	}
	return "", false
}

// replayer is a decode trace's replay: a fresh core and what the recorded
// effects promise to come back (Call results, revocations' outcomes,
// timers).
type replayer struct {
	h     trace.Header
	core  *core.Core
	out   *ReplayOutcome
	last  uint64
	calls []pendingCall // a stack: its top is the Call the next record answers
	// revokes are the Revokes whose outcome did not come yet, by session:
	// the records that asked.
	revokes map[string][]uint64
	// armed are the timers armed and not fired, fired those that did: the
	// records that armed them and that fired them.
	armed, fired map[uint64]uint64
	// opened are the sessions the core opened (their tokens) and watched
	// the session actors: the shell watches only those, and hears of a
	// loss or a departure of only those.
	opened  map[string]uint64
	watched map[string]uint64
}

// Replay replays a decode trace (one a Server recorded: Config.TracePath,
// Config.Trace, EnvTrace) through a fresh decode core, one record at a
// time, holding the core's state, never the trace; kvstream replay calls
// it through package lab/replay. Every record's message is decoded and
// stepped into the core, and the effects the core returns must equal the
// recorded ones. The trace must account for every message:
//
//   - records are numbered one after the other, and there are as many as
//     the header says;
//   - a Call's result (AdmittedMsg, SizedMsg, AccessMsg, VerifiedMsg) is
//     the next record, as the shell steps it in at once while it performs
//     the effects in order (depth first: a result's own Calls are answered
//     before the next Call of the record that asked for it), and there is
//     no result without its Call; the trace does not end with a Call
//     unanswered;
//   - a RevokedMsg comes after a Revoke of its session, one per Revoke;
//   - a TimerMsg comes after the ArmTimer of its id, at most once;
//   - a PeerLostMsg names a session the core opened, and a DepartedMsg a
//     session actor it watches: the shell hears of no other.
//
// What came from outside is fed from the trace as recorded: the network's
// messages, the heartbeats' verdicts, the serving stack's calls, and the
// results of the Calls and revocations (the shell's, which a replay
// cannot redo). The first mismatch ends the replay: the outcome's
// Divergence names the record, its line, and both sides. A stream error
// (a line the reader refuses, a message that does not decode) is an error
// naming the line; a header that is not a decode server's, or whose ring
// dropped records, is an error naming the header.
func Replay(s trace.Stream) (*ReplayOutcome, error) {
	h := s.Header()
	if err := h.Validate(); err != nil {
		return nil, err
	}
	if h.Side != trace.SideDecode {
		return nil, errors.Newf("trace header: side %q: not a decode server's trace (package lab/replay replays an engine's)", trace.Excerpt(h.Side, 64))
	}
	if h.Dropped > 0 {
		return nil, errors.Newf("trace header: the ring dropped the first %d records: a decode core is replayed from the server's start (record with a larger Config.TraceCapacity)", h.Dropped)
	}
	rules, pool, err := replayRules(h.Decode)
	if err != nil {
		return nil, err
	}
	r := &replayer{h: h, core: core.NewCore(rules, pool), out: &ReplayOutcome{SessionsEnded: map[string]int{}},
		revokes: map[string][]uint64{}, armed: map[uint64]uint64{}, fired: map[uint64]uint64{}, opened: map[string]uint64{}, watched: map[string]uint64{}}
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
			return r.out, nil
		}
	}
}

// replayRules rebuilds the core's rules and pool from a validated header,
// with the checks the Server makes of its Config.
func replayRules(c *trace.DecodeConfig) (core.Rules, []Buffer, error) {
	r := core.Rules{MaxSessions: c.MaxSessions, MaxRoomsPerSession: c.MaxRoomsPerSession, Prefills: slices.Clone(c.Prefills), TLS: c.TLS,
		PageSize: c.PageSize, RoomTimeout: time.Duration(c.RoomTimeout), ByeGrace: time.Duration(c.ByeGrace),
		AcceptUnknownRooms: c.AcceptUnknownRooms, Admit: c.Admit, Verify: c.Verify, Size: c.Size, MaxPoolBytes: c.MaxPoolBytes,
		MaxChunksPerRoom: c.MaxChunksPerRoom}
	if r.MaxChunksPerRoom == 0 {
		r.MaxChunksPerRoom = DefaultMaxChunksPerRoom
	}
	if g := c.Group; g != nil {
		rule, err := cp.ParseRule(g.Rule)
		if err != nil {
			return r, nil, errors.Wrap(err, "trace header: group")
		}
		r.Group = &core.Group{Size: g.Size, Rule: rule, PageSize: g.PageSize}
		if err := core.CheckGroup(*r.Group); err != nil {
			return r, nil, errors.Wrap(err, "trace header: group")
		}
	}
	var pool []Buffer
	for i, b := range c.Pool {
		// Addresses are the shell's; the core keeps the geometry.
		pool = append(pool, Buffer{Name: b.Name, Base: uint64(i+1) << 40, ItemLen: b.ItemLen, Pages: b.Pages})
	}
	switch {
	case len(pool) > 0 && c.Size:
		return r, nil, errors.New("trace header: a pool, and a server whose pool a Hello sizes (size)")
	case len(pool) == 0 && !c.Size:
		return r, nil, errors.New("trace header: no pool, and a server whose pool no Hello sizes (size false)")
	case len(pool) > 0:
		if err := core.CheckPool(pool); err != nil {
			return r, nil, errors.Wrap(err, "trace header: pool")
		}
	}
	return r, pool, nil
}

func (r *replayer) step(rec *trace.Record) (*ReplayDivergence, error) {
	div := func(reason string, recorded, replayed []string) *ReplayDivergence {
		return &ReplayDivergence{Seq: rec.Seq, Line: rec.Line, Actor: rec.Actor, ID: rec.ID, Type: rec.Type, Reason: reason, Recorded: recorded, Replayed: replayed}
	}
	recorded := func() []string { return []string{rec.Type + " " + trace.Canonical(rec.Msg)} }
	// Records are numbered as the actor steps its core, one after the
	// other: a gap is a record missing, a number out of order one moved,
	// repeated or renumbered.
	switch want := r.last + 1; {
	case rec.Seq == want:
	case rec.Seq > want:
		return div(fmt.Sprintf("record %d follows record %d: %s missing", rec.Seq, r.last, missing(want, rec.Seq-1)), []string{fmt.Sprintf("seq %d", want)}, []string{fmt.Sprintf("seq %d", rec.Seq)}), nil
	default:
		return div(fmt.Sprintf("record %d follows record %d: records are numbered one after the other (repeated, moved or renumbered)", rec.Seq, r.last), []string{fmt.Sprintf("seq %d", want)}, []string{fmt.Sprintf("seq %d", rec.Seq)}), nil
	}
	r.last = rec.Seq
	if rec.Actor != trace.DecodeActor || rec.ID != r.h.Decode.Server {
		return div(fmt.Sprintf("the trace is server %s's: its records are actor %s %s", trace.Excerpt(r.h.Decode.Server, 64), trace.DecodeActor, trace.Excerpt(r.h.Decode.Server, 64)),
			[]string{rec.Actor + " " + rec.ID}, []string{trace.DecodeActor + " " + r.h.Decode.Server}), nil
	}
	msg, err := core.DecodeMsg(rec.Type, rec.Msg)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", rec.Where())
	}
	answers, d := r.accounted(rec, msg, div, recorded)
	if d != nil {
		return d, nil
	}
	effs := r.core.Step(msg)
	r.out.Replayed++
	got := core.EffectLines(effs)
	if !slices.Equal(got, rec.Effects) {
		reason := "the replayed core's effects differ from the recorded ones"
		if answers != nil {
			// A result continues the message that made the Call: what
			// differs may come from either.
			reason += fmt.Sprintf(" (this result answers record %d's %s: the effects are of that record's message too)", answers.seq, trace.Excerpt(answers.line, 128))
		}
		return div(reason, rec.Effects, got), nil
	}
	r.promised(rec.Seq, effs)
	return nil, nil
}

// accounted checks that a message the core takes is one the recording
// can have delivered at this point (the rules of Replay's comment); for a
// Call's result, it returns the Call.
func (r *replayer) accounted(rec *trace.Record, msg core.Msg, div func(string, []string, []string) *ReplayDivergence, recorded func() []string) (*pendingCall, *ReplayDivergence) {
	if n := len(r.calls); n > 0 {
		c := r.calls[n-1]
		if rec.Type != c.result {
			return nil, div(fmt.Sprintf("record %d returned %s: the shell steps its result in at once, so the next record must be a %s", c.seq, trace.Excerpt(c.line, 128), c.result),
				recorded(), []string{fmt.Sprintf("%s (the result of record %d's Call)", c.result, c.seq)})
		}
		r.calls = r.calls[:n-1]
		return &c, nil
	}
	return nil, r.external(rec, msg, div, recorded)
}

// external checks a message that answers no Call.
func (r *replayer) external(rec *trace.Record, msg core.Msg, div func(string, []string, []string) *ReplayDivergence, recorded func() []string) *ReplayDivergence {
	switch m := msg.(type) {
	case core.AdmittedMsg, core.SizedMsg, core.AccessMsg, core.VerifiedMsg:
		return div("the result of a Call, but no Call waits for one: the shell steps a result only right after the Call", recorded(), nil)
	case core.RevokedMsg:
		asked := r.revokes[m.Session]
		if len(asked) == 0 {
			return div(fmt.Sprintf("the outcome of revoking session %s, but no Revoke of it waits for one (each Revoke has one outcome)", trace.Excerpt(m.Session, 64)), recorded(), nil)
		}
		if len(asked) == 1 {
			delete(r.revokes, m.Session)
		} else {
			r.revokes[m.Session] = asked[1:]
		}
	case core.TimerMsg:
		if at, ok := r.fired[m.ID]; ok {
			return div(fmt.Sprintf("timer %d fired already, at record %d: a timer fires at most once", m.ID, at), recorded(), nil)
		}
		if _, ok := r.armed[m.ID]; !ok {
			return div(fmt.Sprintf("timer %d was never armed: no record returned its ArmTimer", m.ID), recorded(), nil)
		}
		delete(r.armed, m.ID)
		r.fired[m.ID] = rec.Seq
	case core.PeerLostMsg:
		if _, ok := r.opened[m.Session]; !ok {
			return div(fmt.Sprintf("session %s was never opened: the shell watches the heartbeats of the sessions the core opened only", trace.Excerpt(m.Session, 64)), recorded(), nil)
		}
	case core.DepartedMsg:
		if _, ok := r.watched[m.Actor]; !ok {
			return div(fmt.Sprintf("session actor %s was never watched: the shell watches the actors of the sessions the core opened only", trace.Excerpt(m.Actor, 128)), recorded(), nil)
		}
	}
	return nil
}

// promised notes what the effects of record seq promise to come back, and
// what the replayed core decided.
func (r *replayer) promised(seq uint64, effs []core.Effect) {
	var calls []pendingCall
	lines := core.EffectLines(effs)
	for i, e := range effs {
		if res, ok := callResult(e); ok {
			calls = append(calls, pendingCall{result: res, seq: seq, line: lines[i]})
		}
		switch e := e.(type) {
		case core.Revoke:
			r.revokes[e.Session] = append(r.revokes[e.Session], seq)
		case core.ArmTimer:
			r.armed[e.ID] = seq
		case core.SessionOpened:
			r.out.Sessions++
			r.opened[e.Session.Token] = seq
			r.watched[e.Session.Actor] = seq
		case core.SessionEnded:
			r.out.SessionsEnded[e.Outcome]++
		case core.RoomEnded:
			ro := RoomOutcome{Room: e.Room.ID, Outcome: e.Outcome}
			if e.Err != nil {
				ro.Err = e.Err.Error()
			}
			r.out.Rooms = append(r.out.Rooms, ro)
		}
	}
	// The shell performs the effects in order, stepping a Call's result
	// (and what it returns) before the next effect: the first Call is
	// answered first.
	slices.Reverse(calls)
	r.calls = append(r.calls, calls...)
}

// atEnd checks what the trace left: as many records as its header says,
// and no Call unanswered (a trace is written at Close, or dumped between
// two messages). Revocations under way are counted.
func (r *replayer) atEnd() *ReplayDivergence {
	for _, asked := range r.revokes {
		r.out.InFlight += len(asked)
	}
	if h := r.h; r.out.Records != h.Records {
		reason := fmt.Sprintf("the header says the trace holds %d records; it holds %d, the last being record %d", h.Records, r.out.Records, r.last)
		if last := uint64(h.Records); r.out.Records < h.Records && last > r.last {
			reason += ": " + missing(r.last+1, last) + " missing"
		}
		return &ReplayDivergence{Seq: r.last, Actor: trace.DecodeActor, ID: "trace", Reason: reason}
	}
	if n := len(r.calls); n > 0 {
		c := r.calls[n-1]
		return &ReplayDivergence{Seq: c.seq, Actor: trace.DecodeActor, ID: r.h.Decode.Server,
			Reason: fmt.Sprintf("the trace ends while record %d's %s waits for its result", c.seq, trace.Excerpt(c.line, 128)), Recorded: []string{c.line},
			Replayed: []string{c.result + " (the next record)"}}
	}
	return nil
}

// missing names the records from..to.
func missing(from, to uint64) string {
	if from == to {
		return "record " + strconv.FormatUint(from, 10) + " is"
	}
	return fmt.Sprintf("records %d to %d are", from, to)
}
