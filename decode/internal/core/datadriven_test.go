package core

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages/wire"
)

// TestCoreDataDriven runs testdata/*.txt: each file tells one rule of the
// decode core as messages and the effects they produce (testdata/README.md
// lists the commands). Regenerate with
//
//	go test ./decode/internal/core -run TestCoreDataDriven -rewrite
//
// and read the diff: a changed line is a changed decision.
func TestCoreDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if filepath.Ext(path) != ".txt" {
			t.Skip("not a test file")
		}
		w := &ddWorld{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return w.run(t, d)
		})
	})
}

// ddWorld is one file's core and the answers its Calls get.
type ddWorld struct {
	core     *Core
	rules    Rules
	pool     []Buffer
	sessions map[string]ddSession // by test name
	// Answers to Calls; "" is success.
	admit, size, access, verify string
}

type ddSession struct {
	node, peer, actor string
}

func (w *ddWorld) run(t *testing.T, d *datadriven.TestData) string {
	if d.Cmd != "rules" && w.core == nil {
		d.Fatalf(t, "a file starts with rules")
	}
	switch d.Cmd {
	case "rules":
		return w.newCore(t, d)
	case "answers":
		for _, a := range d.CmdArgs {
			v := strings.Join(a.Vals, ",")
			switch a.Key {
			case "admit":
				w.admit = v
			case "size":
				w.size = v
			case "access":
				w.access = v
			case "verify":
				w.verify = v
			default:
				d.Fatalf(t, "answers: unknown %q", a.Key)
			}
		}
		return "ok"
	case "hello":
		return w.step(w.helloMsg(t, d))
	case "notice":
		return w.step(w.noticeMsg(t, d))
	case "bye":
		name := str(d, "session", "s1")
		s := w.sessions[name]
		b := &wire.Bye{Session: name, Chunks: uint64(num(t, d, "chunks", 0)), Aborted: str(d, "aborted", "")}
		return w.step(ByeMsg{From: Origin{Node: str(d, "from", s.node), Peer: str(d, "peer", s.peer)}, Bye: b})
	case "departed":
		return w.step(DepartedMsg{Actor: w.sessions[str(d, "session", "s1")].actor, Grace: dur(t, d, "grace", 10*time.Second)})
	case "lost":
		return w.step(PeerLostMsg{Session: str(d, "session", "s1"), Cause: errors.New("no heartbeat answer for 3.5s")})
	case "revoked":
		var err error
		if d.HasArg("fail") {
			err = errors.Mark(errors.New("cannot confirm"), ErrNotQuiesced)
		}
		return w.step(RevokedMsg{Session: str(d, "session", "s1"), Err: err})
	case "timer":
		return w.step(TimerMsg{ID: uint64(num(t, d, "id", 1))})
	case "expect":
		return w.step(ExpectMsg{Room: uint64(num(t, d, "room", 1)), Pages: ints(t, d, "pages"), From: str(d, "from", "")})
	case "release":
		return w.step(ReleaseMsg{Room: uint64(num(t, d, "room", 1))})
	case "lookup":
		return w.step(LookupMsg{Room: uint64(num(t, d, "room", 1))})
	case "drain":
		return w.step(DrainMsg{})
	case "cancel-room":
		return w.step(CancelRoomMsg{Room: uint64(num(t, d, "room", 1)), Cause: str(d, "cause", "")})
	case "cancel":
		name := str(d, "session", "s1")
		s := w.sessions[name]
		return w.step(CancelMsg{From: Origin{Node: str(d, "from", s.node), Peer: str(d, "peer", s.peer)},
			Cancel: &wire.Cancel{Session: name, Room: uint64(num(t, d, "room", 1)), Reason: str(d, "reason", ""), NotQuiesced: d.HasArg("not-quiesced")}})
	case "close":
		return w.step(CloseMsg{})
	case "state":
		st := w.core.state()
		return fmt.Sprintf("sessions=%d rooms=%d pooled=%v draining=%v closed=%v quarantined=%d tainted=%v held=%d lingering=%d",
			st.Sessions, st.Rooms, st.Pooled, st.Draining, st.Closed, st.Quarantined, st.Tainted, len(w.core.ledger.owner), len(w.core.ledger.lingering))
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

func (w *ddWorld) newCore(t *testing.T, d *datadriven.TestData) string {
	r := Rules{MaxSessions: num(t, d, "max-sessions", 4), MaxRoomsPerSession: num(t, d, "max-rooms", 8), MaxChunksPerRoom: num(t, d, "max-chunks", 64),
		TLS: d.HasArg("tls"), PageSize: num(t, d, "page", 0), AcceptUnknownRooms: d.HasArg("unknown"),
		Admit: d.HasArg("admit"), Verify: d.HasArg("verify"), Size: d.HasArg("size"), MaxPoolBytes: 1 << 20,
		ByeGrace: dur(t, d, "grace", time.Second), RoomTimeout: dur(t, d, "timeout", 0)}
	if d.HasArg("prefills") {
		r.Prefills = strs(d, "prefills")
	}
	if g := num(t, d, "group", 0); g > 0 {
		rule := cp.SharedKV
		if str(d, "rule", "shared") == "contiguous" {
			rule = cp.Contiguous
		}
		r.Group = &Group{Size: g, Rule: rule, PageSize: num(t, d, "group-page", 4)}
	}
	pages := num(t, d, "pages", 16)
	w.pool = []Buffer{{Name: "K", Base: 1 << 20, ItemLen: 64, Pages: pages}, {Name: "V", Base: 2 << 20, ItemLen: 64, Pages: pages}}
	w.rules, w.sessions = r, map[string]ddSession{}
	var pool []Buffer
	if !r.Size {
		pool = w.pool
	}
	w.core = NewCore(r, pool)
	return fmt.Sprintf("pool: %s", poolText(pool))
}

func poolText(pool []Buffer) string {
	if pool == nil {
		return "sized by a Hello"
	}
	return fmt.Sprintf("%d buffers of %d pages of %d bytes", len(pool), pool[0].Pages, pool[0].ItemLen)
}

func (w *ddWorld) helloMsg(t *testing.T, d *datadriven.TestData) HelloMsg {
	name := str(d, "session", "s1")
	prefill := str(d, "prefill", "p")
	s := ddSession{node: str(d, "from", "n-"+name), peer: str(d, "peer", ""), actor: ""}
	if w.rules.TLS && s.peer == "" && !d.HasArg("peer") {
		s.peer = prefill
	}
	h := &wire.Hello{Version: uint32(num(t, d, "version", int(ProtocolVersion))), Prefill: prefill, SessionAddress: str(d, "actor-node", s.node),
		SessionId: "actor-" + name, PageSize: uint32(num(t, d, "page", 4))}
	s.actor = h.SessionAddress + "/" + h.SessionId
	nb := num(t, d, "buffers", 2)
	for i := range nb {
		h.Buffers = append(h.Buffers, &wire.Buffer{Name: "b" + strconv.Itoa(i), Layer: int32(i), ItemLen: uint64(num(t, d, "item", 64)), Pages: uint64(num(t, d, "prefill-pages", 16))})
	}
	if d.HasArg("rank") {
		h.Metadata = map[string]string{RankKey: str(d, "rank", "")}
	}
	w.sessions[name] = s
	return HelloMsg{From: Origin{Node: s.node, Peer: s.peer}, Hello: h, Token: name}
}

func (w *ddWorld) noticeMsg(t *testing.T, d *datadriven.TestData) NoticeMsg {
	name := str(d, "session", "s1")
	s := w.sessions[name]
	n := &wire.ChunkNotice{Session: name, Room: uint64(num(t, d, "room", 1)), Start: int64(num(t, d, "start", 0)),
		End: int64(num(t, d, "end", 0)), Last: d.HasArg("last"), Status: wire.Status_SUCCEEDED, NotQuiesced: d.HasArg("not-quiesced"),
		Bytes: uint64(num(t, d, "bytes", 0))}
	switch str(d, "status", "ok") {
	case "failed":
		n.Status, n.Error = wire.Status_FAILED, "finish timed out"
	case "dropped":
		n.Status, n.Error = wire.Status_DROPPED, "dropped"
	case "bogus":
		n.Status = 9
	}
	pos, dst := ints(t, d, "pos"), ints(t, d, "dst")
	for i := range pos {
		n.Positions = append(n.Positions, int64(pos[i]))
	}
	for i := range dst {
		n.DstPages = append(n.DstPages, int64(dst[i]))
	}
	return NoticeMsg{From: Origin{Node: str(d, "from", s.node), Peer: str(d, "peer", s.peer)}, Notice: n}
}

// step steps the core and prints its effects; Calls are answered at once,
// their results printed under them with the effects they produce.
func (w *ddWorld) step(m Msg) string {
	var b strings.Builder
	w.print(&b, w.core.Step(m), "")
	return b.String()
}

func (w *ddWorld) print(b *strings.Builder, effs []Effect, indent string) {
	for _, e := range effs {
		line := effectText(e)
		if line == "" {
			continue
		}
		fmt.Fprintf(b, "%s%s\n", indent, line)
		if res := w.answer(e); res != nil {
			fmt.Fprintf(b, "%s  -> %s\n", indent, msgText(res))
			w.print(b, w.core.Step(res), indent+"  ")
		}
	}
}

// answer is a Call's result, as the world is told to give it.
func (w *ddWorld) answer(e Effect) Msg {
	fail := func(v string) error {
		if v == "" || v == "ok" {
			return nil
		}
		return errors.New(v)
	}
	switch e := e.(type) {
	case CallAdmit:
		return AdmittedMsg{Err: fail(w.admit)}
	case CallSize:
		if err := fail(w.size); err != nil {
			return SizedMsg{Err: err}
		}
		pool := slices.Clone(w.pool)
		for i := range pool {
			pool[i].ItemLen = e.Layout[i%len(e.Layout)].ItemLen
		}
		return SizedMsg{Buffers: pool}
	case CallOpenAccess:
		switch w.access {
		case "", "ok":
			return AccessMsg{Address: []byte("ap-" + e.Session), Revocable: true}
		case "none":
			return AccessMsg{Address: []byte("worker")}
		}
		return AccessMsg{Err: errors.New(w.access)}
	case CallVerify:
		return VerifiedMsg{Err: fail(w.verify)}
	}
	return nil
}

func msgText(m Msg) string {
	switch m := m.(type) {
	case AdmittedMsg:
		return "admitted" + errSuffix(m.Err)
	case SizedMsg:
		if m.Err != nil {
			return "sized" + errSuffix(m.Err)
		}
		return "sized: " + poolText(m.Buffers)
	case AccessMsg:
		if m.Err != nil {
			return "access" + errSuffix(m.Err)
		}
		return fmt.Sprintf("access %s revocable=%v", m.Address, m.Revocable)
	case VerifiedMsg:
		return "verified" + errSuffix(m.Err)
	}
	return fmt.Sprintf("%T", m)
}

func errSuffix(err error) string {
	if err == nil {
		return " ok"
	}
	return ": " + err.Error() + classes(err)
}

func effectText(e Effect) string {
	switch e := e.(type) {
	case AnswerHello:
		if e.Code == wire.Code_OK {
			return fmt.Sprintf("AnswerHello OK session=%s address=%s", e.Session, e.Address)
		}
		return fmt.Sprintf("AnswerHello %s reason=%s: %s", e.Code, e.Reason, e.Text)
	case AnswerNotice:
		if e.Code == wire.Code_OK {
			return "AnswerNotice OK"
		}
		if e.Reason == "" {
			return fmt.Sprintf("AnswerNotice %s: %s", e.Code, e.Text)
		}
		return fmt.Sprintf("AnswerNotice %s reason=%s: %s", e.Code, e.Reason, e.Text)
	case AnswerBye:
		s := fmt.Sprintf("AnswerBye %s chunks=%d failed=%d", e.Summary.Code, e.Summary.Chunks, e.Summary.Failed)
		if e.Summary.Error != "" {
			s += ": " + e.Summary.Error
		}
		return s
	case Reply:
		switch {
		case e.Err != nil:
			return "Reply" + errSuffix(e.Err)
		case e.Room.ID != 0 || e.Ended:
			return fmt.Sprintf("Reply room=%d instance=%d ended=%v complete=%v chunks=%d", e.Room.ID, e.Instance, e.Ended, e.Room.Complete, len(e.Room.Chunks))
		case e.Drained:
			return "Reply ok drained"
		}
		return "Reply ok"
	case CallAdmit:
		return "CallAdmit prefill=" + e.Prefill
	case CallSize:
		return fmt.Sprintf("CallSize %d buffers", len(e.Layout))
	case CallOpenAccess:
		return "CallOpenAccess " + e.Session
	case CallVerify:
		return fmt.Sprintf("CallVerify %s room=%d [%d, %d)", e.Session, e.Chunk.Room, e.Chunk.Start, e.Chunk.End)
	case SessionOpened:
		return fmt.Sprintf("SessionOpened %s prefill=%s identity=%s rank=%d page=%d", e.Session.Token, e.Session.Prefill, e.Session.Identity, e.Session.Rank, e.Session.PageSize)
	case Revoke:
		if e.Lost {
			return "Revoke " + e.Session + " (lost)"
		}
		return "Revoke " + e.Session
	case SessionEnded:
		r := e.Report
		s := fmt.Sprintf("SessionEnded %s outcome=%s chunks=%d failed=%d rooms=%d complete=%v empty=%v", e.Session, e.Outcome, r.Chunks, r.Failed, r.Rooms, r.Complete, r.Empty)
		if e.Err != nil {
			s += errSuffix(e.Err)
		}
		return s
	case RoomEnded:
		s := fmt.Sprintf("RoomEnded room=%d instance=%d outcome=%s chunks=%d", e.Room.ID, e.Instance, e.Outcome, len(e.Room.Chunks))
		if e.Err != nil {
			s += errSuffix(e.Err)
		}
		return s
	case ArmTimer:
		return fmt.Sprintf("ArmTimer id=%d after=%v", e.ID, e.After)
	case ReleasePool:
		return "ReleasePool"
	case Verified:
		return fmt.Sprintf("Verified bytes=%d", e.Bytes)
	case Quarantined:
		return fmt.Sprintf("Quarantined pages=%d", e.Pages)
	case Drained:
		return "Drained"
	case TellDrain:
		return "TellDrain " + e.Session
	case TellCancel:
		return fmt.Sprintf("TellCancel %s room=%d: %s", e.Session, e.Room, e.Reason)
	case Cancelled:
		return fmt.Sprintf("Cancelled room=%d direction=%s", e.Room, e.Direction)
	case CancelSettled:
		return fmt.Sprintf("CancelSettled room=%d not-quiesced=%v", e.Room, e.NotQuiesced)
	case AnswerCancel:
		if e.Code == wire.Code_OK {
			return "AnswerCancel OK"
		}
		return fmt.Sprintf("AnswerCancel %s reason=%s: %s", e.Code, e.Reason, e.Text)
	case Log:
		if e.Level == Warn {
			return "log: " + e.Msg
		}
		return ""
	}
	return fmt.Sprintf("%T", e)
}

// classes names the marks an error carries, as callers test them.
func classes(err error) string {
	var cs []string
	for _, c := range []struct {
		name string
		mark error
	}{
		{"bad input", ErrBadInput}, {"chunk failed", ErrChunkFailed}, {"prefill lost", ErrPrefillLost},
		{"session aborted", ErrSessionAborted}, {"not quiesced", ErrNotQuiesced}, {"closed", ErrClosed},
		{"cancelled", ErrCancelled},
	} {
		if errors.Is(err, c.mark) {
			cs = append(cs, c.name)
		}
	}
	if len(cs) == 0 {
		return ""
	}
	return " [" + strings.Join(cs, ", ") + "]"
}

// --- arguments ---

func str(d *datadriven.TestData, key, def string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			return strings.Join(a.Vals, ",")
		}
	}
	return def
}

func strs(d *datadriven.TestData, key string) []string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			return a.Vals
		}
	}
	return nil
}

func num(t *testing.T, d *datadriven.TestData, key string, def int) int {
	v := str(d, key, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		d.Fatalf(t, "%s=%q: %v", key, v, err)
	}
	return n
}

func dur(t *testing.T, d *datadriven.TestData, key string, def time.Duration) time.Duration {
	v := str(d, key, "")
	if v == "" {
		return def
	}
	x, err := time.ParseDuration(v)
	if err != nil {
		d.Fatalf(t, "%s=%q: %v", key, v, err)
	}
	return x
}

// ints reads key=(1,2,3) or key=a-b (the range [a, b]).
func ints(t *testing.T, d *datadriven.TestData, key string) []int {
	var out []int
	for _, v := range strs(d, key) {
		if lo, hi, ok := strings.Cut(v, "-"); ok && lo != "" {
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				d.Fatalf(t, "%s: bad range %q", key, v)
			}
			for i := a; i <= b; i++ {
				out = append(out, i)
			}
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			d.Fatalf(t, "%s: %q: %v", key, v, err)
		}
		out = append(out, n)
	}
	return out
}
