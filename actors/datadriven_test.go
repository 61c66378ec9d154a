package actors

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
)

// TestDataDriven runs the files of testdata/: each tells one bug of the
// per-layer commit log (docs/ARCHITECTURE.md, Invariants) as messages fed to
// the functional cores, each followed by the effects the cores returned.
// The commands are described in testdata/README.md. Regenerate the expected
// output with
//
//	go test ./actors -run TestDataDriven -rewrite
//
// and read the diff: a changed line is a changed decision.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if filepath.Ext(path) != ".txt" {
			t.Skip("not a test file")
		}
		w := &world{chunks: map[string]*ddChunk{}, names: map[messages.Chunk]string{}, rooms: map[uint64]*RoomCore{}}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return w.run(t, d)
		})
	})
}

// world is one file's cores: a layout, chunk cores by name, the forward
// core, room cores, the manager core and the current Work's submit core.
// Effects that deliver a message to a core of the world (FanOut, Send) are
// delivered at once and the receiver's effects printed under them.
type world struct {
	layout  *plan.Layout
	peers   *Peers
	serial  uint64
	chunks  map[string]*ddChunk
	order   []string // chunk names in creation order
	names   map[messages.Chunk]string
	forward *ForwardCore
	rooms   map[uint64]*RoomCore
	manager *ManagerCore
	submit  *SubmitCore
}

type ddChunk struct {
	name string
	core *ChunkCore
	plan *plan.Plan
	// owed is the Work the chunk submitted that no Submitted answered yet;
	// flying the batches posted and not completed: what serve answers.
	owed, flying []messages.Work
	// early is the batches whose BatchDone came before their Submitted.
	early []messages.Work
}

// ddEvent is an event named for the reader: f1.g0 is forward 1's group 0.
type ddEvent string

func (ddEvent) Wait(context.Context) error { return nil }

// run performs one command of a file and returns what it prints.
func (w *world) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "layout":
		return w.newLayout(t, d)
	case "new-chunk":
		return w.newChunk(t, d)
	case "register":
		return w.register(t, d)
	case "step":
		c := w.chunk(t, d)
		kind := kindArg(t, d)
		return w.deliver(c, w.chunkMsg(t, d, c, kind))
	case "serve":
		return w.serve(t, d)
	case "lose":
		// The transport loses a batch in flight for good: serve will never
		// complete it.
		c := w.chunk(t, d)
		n := len(c.flying)
		if c.flying = without1(c.flying, intArg(t, d, "seq", 0), intArg(t, d, "dest", 0), intArg(t, d, "try", 0)); len(c.flying) == n {
			d.Fatalf(t, "no such batch in flight")
		}
		return "lost"
	case "counts":
		c := w.chunk(t, d)
		e, p, po, co := c.core.Counts()
		return fmt.Sprintf("enqueued=%d processed=%d posted=%d completed=%d done=%v", e, p, po, co, c.core.Done())
	case "forward":
		return w.stepForward(t, d)
	case "room":
		return w.stepRoom(t, d)
	case "manager":
		return w.stepManager(t, d)
	case "new-work":
		var peer string
		d.ScanArgs(t, "peer", &peer)
		w.submit = NewSubmitCore(peer)
		return "a Work for " + peer
	case "submit":
		return w.stepSubmit(t, d)
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

// --- arguments ---

// kindArg is a command's first argument without a value: the message to
// step (step group-ready forward=1 group=0; step chunk=b finish).
func kindArg(t *testing.T, d *datadriven.TestData) string {
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 {
			return a.Key
		}
	}
	d.Fatalf(t, "%s: which message?", d.Cmd)
	return ""
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v string
	d.ScanArgs(t, key, &v)
	if v == "rest" {
		return messages.Rest
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		d.Fatalf(t, "%s=%s: %v", key, v, err)
	}
	return n
}

func strArg(t *testing.T, d *datadriven.TestData, key, def string) string {
	if !d.HasArg(key) {
		return def
	}
	var v string
	d.ScanArgs(t, key, &v)
	return v
}

func durArg(t *testing.T, d *datadriven.TestData, key string, def time.Duration) time.Duration {
	if !d.HasArg(key) {
		return def
	}
	v, err := time.ParseDuration(strArg(t, d, key, ""))
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

// pagesArg reads a page list written as ranges: src=(0-3, 8, 10-11).
func pagesArg(t *testing.T, d *datadriven.TestData, key string) []int {
	var out []int
	for _, a := range d.CmdArgs {
		if a.Key != key {
			continue
		}
		for _, v := range a.Vals {
			lo, hi, isRange := strings.Cut(v, "-")
			from, err := strconv.Atoi(strings.TrimSpace(lo))
			if err != nil {
				d.Fatalf(t, "%s: %v", key, err)
			}
			to := from
			if isRange {
				if to, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil {
					d.Fatalf(t, "%s: %v", key, err)
				}
			}
			for p := from; p <= to; p++ {
				out = append(out, p)
			}
		}
	}
	return out
}

// errArg builds the error named by a fail= argument. Marked errors carry
// the class the engine's callers test with errors.Is.
func errArg(t *testing.T, d *datadriven.TestData, key string) error {
	if !d.HasArg(key) {
		return nil
	}
	switch v := strArg(t, d, key, ""); v {
	case "event-wait":
		return errors.Mark(errors.New("illegal address"), ErrEventWait) // as a submitter reports it
	case "device-lost":
		return errors.Mark(errors.New("CUDA_ERROR_ILLEGAL_ADDRESS"), cuda.ErrDeviceLost)
	case "broken":
		return errors.Mark(errors.New("endpoint closed"), rdma.ErrEndpointBroken)
	case "not-quiesced":
		return errors.Mark(errors.New("drain timed out"), rdma.ErrNotQuiesced)
	case "broken-fenced":
		// A connection that broke, to a receiver that fences epochs (UCX
		// message writes to an access point).
		return errors.Mark(errors.Mark(errors.Mark(errors.New("connection reset"), rdma.ErrEndpointBroken), rdma.ErrNotQuiesced), rdma.ErrFenced)
	case "not-quiesced-fenced":
		return errors.Mark(errors.Mark(errors.New("broke: may land until a later batch lands"), rdma.ErrNotQuiesced), rdma.ErrFenced)
	case "revoked":
		return errors.Mark(errors.Mark(errors.New("the peer revoked this side's access"), rdma.ErrEndpointBroken), rdma.ErrRevoked)
	case "peer-lost":
		return errors.Mark(errors.Mark(errors.New(`peer "d0" lost`), ErrPeerLost), rdma.ErrEndpointBroken)
	case "cancelled":
		return context.Canceled
	default:
		return errors.New(strings.ReplaceAll(v, "-", " "))
	}
}

// --- layouts, plans and chunks ---

// newLayout: layout buffers=N hooks=F k=K [page=4] [cp=1 rank=0 rule=shared].
// Buffer i is written by layer i: buffers past the hook layers fire no hook
// (the MTP draft layer).
func (w *world) newLayout(t *testing.T, d *datadriven.TestData) string {
	n, hooks, k := intArg(t, d, "buffers", 4), intArg(t, d, "hooks", 4), intArg(t, d, "k", 4)
	rule, err := cp.ParseRule(strArg(t, d, "rule", "shared"))
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	bufs := make([]plan.Buffer, n)
	keys := make([]rdma.LocalKey, n)
	for i := range bufs {
		bufs[i] = plan.Buffer{Name: "KV" + strconv.Itoa(i), Base: uint64(i+1) << 32, ItemLen: 16, Pages: 256, Layer: i}
		keys[i] = rdma.LocalKey(i + 1)
	}
	l, err := plan.NewLayout(bufs, keys, hooks, k, intArg(t, d, "page", 4), cp.CP{Size: intArg(t, d, "cp", 1), Rank: intArg(t, d, "rank", 0), Rule: rule})
	if err != nil {
		return "error: " + err.Error()
	}
	w.layout = l
	w.peers = NewPeers()
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %d hook layers in %s of %d", plural(n, "buffer"), hooks, plural(l.Groups.Count(), "group"), k)
	for g := 0; g < l.Groups.Count(); g++ {
		fmt.Fprintf(&b, "\ngroup %d: buffers %s", g, ranges(l.GroupBuffers(g)))
	}
	fmt.Fprintf(&b, "\nhookless: %s", ranges(l.Hookless()))
	return b.String()
}

func (w *world) peer(t *testing.T, id string) {
	if _, ok := w.peers.Get(id); ok {
		return
	}
	p := &plan.Peer{ID: id, Address: []byte(id)}
	for range w.layout.Buffers {
		p.Buffers = append(p.Buffers, plan.PeerBuffer{Region: rdma.RegionDesc{Addr: 1 << 40, Len: 16 * 1024}, ItemLen: 16})
	}
	if err := w.peers.Add(p); err != nil {
		t.Fatal(err)
	}
}

// newChunk: new-chunk [name=a] mode=per-layer|monolithic [buffers= hooks= k=]
// [room=7 start=0 end=16] [dests=1] [owned=4]: a chunk core whose plan sends
// owned pages to each of dests destinations (no page lists: see register).
func (w *world) newChunk(t *testing.T, d *datadriven.TestData) string {
	if d.HasArg("buffers") || w.layout == nil {
		w.newLayout(t, d)
	}
	p := &plan.Plan{Mode: cp.PerLayer, Owned: intArg(t, d, "owned", 4)}
	if strArg(t, d, "mode", "per-layer") == "monolithic" {
		p.Mode = cp.Monolithic
	}
	for i := 0; i < intArg(t, d, "dests", 1); i++ {
		dst := plan.Dest{Info: i, Peer: "d" + strconv.Itoa(i)}
		if p.Owned > 0 {
			dst.Runs = []cp.Run{{Src: 0, Dst: 0, Len: int32(p.Owned)}}
		}
		p.Dests = append(p.Dests, dst)
	}
	return w.addChunk(t, d, p, false)
}

// register: register [name=a] room= start= end= [last] src=(pages)
// [total=N] infos=(d0, d1:dummy) dst=(pages) [per-layer=off]: the plan the
// engine builds at Register (BuildPlan), printed, and a chunk core for it.
func (w *world) register(t *testing.T, d *datadriven.TestData) string {
	spec := &plan.ChunkSpec{
		Room: uint64(intArg(t, d, "room", 7)), Start: intArg(t, d, "start", 0), End: intArg(t, d, "end", 16),
		Last: d.HasArg("last"), SrcPages: pagesArg(t, d, "src"), TotalPages: intArg(t, d, "total", 0),
	}
	dst := pagesArg(t, d, "dst")
	for _, a := range d.CmdArgs {
		if a.Key != "infos" {
			continue
		}
		for _, v := range a.Vals {
			id, dummy := strings.CutSuffix(v, ":dummy")
			if !dummy {
				w.peer(t, id)
			}
			spec.Infos = append(spec.Infos, plan.DecodeInfo{Peer: id, DstPages: dst, Dummy: dummy})
		}
	}
	policy := cp.EveryDestination
	switch v := strArg(t, d, "per-layer", "on"); v {
	case "on":
	case "single":
		policy = cp.SingleDestination
	case "off":
		policy = cp.NoPerLayer
	default:
		d.Fatalf(t, "per-layer=%s: want on, single or off", v)
	}
	p, err := plan.BuildPlan(w.layout, w.peers.Get, spec, policy)
	if err != nil {
		return "error: " + err.Error()
	}
	w.serial++
	p.Chunk = messages.Chunk{ChunkKey: spec.Key(w.layout.PageSize, 0), Serial: w.serial}
	return w.addChunk(t, d, p, true)
}

func (w *world) addChunk(t *testing.T, d *datadriven.TestData, p *plan.Plan, guarded bool) string {
	name := strArg(t, d, "name", "a")
	if _, dup := w.chunks[name]; dup {
		d.Fatalf(t, "chunk %s exists", name)
	}
	if p.Chunk.Serial == 0 {
		w.serial++
		p.Chunk = messages.Chunk{ChunkKey: messages.ChunkKey{Room: uint64(intArg(t, d, "room", 7)), Start: intArg(t, d, "start", 0), End: intArg(t, d, "end", 16)}, Serial: w.serial}
	}
	c := &ddChunk{name: name, core: NewChunkCore(w.layout, p), plan: p}
	w.chunks[name] = c
	w.order = append(w.order, name)
	w.names[p.Chunk] = name
	var b strings.Builder
	fmt.Fprintf(&b, "chunk %s: room %d tokens [%d, %d)", name, p.Chunk.Room, p.Chunk.Start, p.Chunk.End)
	if guarded {
		fmt.Fprintf(&b, " = pages [%d, %d), %s (%s)", p.Range.PageStart, p.Range.PageStart+p.Range.Pages, p.Mode, p.Reason)
	} else {
		fmt.Fprintf(&b, ", %s", p.Mode)
	}
	fmt.Fprintf(&b, ", %s owned", plural(p.Owned, "page"))
	for _, dst := range p.Dests {
		fmt.Fprintf(&b, "\n  to %s:", dst.Peer)
		for _, r := range dst.Runs {
			fmt.Fprintf(&b, " %s", runText(r))
		}
	}
	return b.String()
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

func runText(r cp.Run) string {
	if r.Len == 1 {
		return fmt.Sprintf("page %d->%d", r.Src, r.Dst)
	}
	return fmt.Sprintf("pages %d-%d->%d-%d", r.Src, r.Src+r.Len-1, r.Dst, r.Dst+r.Len-1)
}

func (w *world) chunk(t *testing.T, d *datadriven.TestData) *ddChunk {
	name := strArg(t, d, "chunk", "")
	if name == "" {
		if len(w.order) == 0 {
			d.Fatalf(t, "no chunk yet")
		}
		name = w.order[len(w.order)-1]
	}
	c, ok := w.chunks[name]
	if !ok {
		d.Fatalf(t, "no chunk %s", name)
	}
	return c
}

// --- the chunk core ---

// chunkMsg builds the message a step command names.
func (w *world) chunkMsg(t *testing.T, d *datadriven.TestData, c *ddChunk, kind string) any {
	fw := uint64(intArg(t, d, "forward", 1))
	switch kind {
	case "bind":
		return &messages.Bind{Forward: fw}
	case "group-ready":
		g := intArg(t, d, "group", 0)
		return &messages.GroupReady{Forward: fw, Group: g, Event: ddEvent(fmt.Sprintf("f%d.g%d", fw, g)), Err: errArg(t, d, "fail")}
	case "forward-end":
		return &messages.ForwardEnd{Forward: fw, Event: ddEvent(fmt.Sprintf("f%d.end", fw)), Err: errArg(t, d, "fail")}
	case "finish":
		return w.finishMsg(t, d, c.plan.Chunk.Room)
	case "drop":
		return &messages.Drop{Room: c.plan.Chunk.Room, Timeout: durArg(t, d, "timeout", time.Second), Reply: make(chan []messages.Result, 1)}
	case "submitted":
		m := &messages.Submitted{Seq: intArg(t, d, "seq", 0), Dest: intArg(t, d, "dest", 0), Err: errArg(t, d, "fail")}
		if d.HasArg("posted") {
			m.Posted, m.Bytes, m.Blocks = true, uint64(intArg(t, d, "bytes", 64)), 1
		}
		return m
	case "batch-done":
		err := errArg(t, d, "fail")
		return &messages.BatchDone{Seq: intArg(t, d, "seq", 0), Dest: intArg(t, d, "dest", 0), Err: err, Broken: BrokenEndpoint(err), Try: intArg(t, d, "try", 0)}
	case "overdue":
		return &messages.BatchOverdue{Seq: intArg(t, d, "seq", 0), Dest: intArg(t, d, "dest", 0), Try: intArg(t, d, "try", 0),
			InFlight: uint64(intArg(t, d, "inflight-mib", 0)) << 20}
	case "cancel":
		return &messages.Cancel{Reason: context.Canceled}
	case "timeout":
		return &messages.Timeout{}
	case "torn-down":
		return &messages.TornDown{Err: errArg(t, d, "fail")}
	case "quiesced":
		return &messages.Quiesced{Seq: intArg(t, d, "seq", 0), Dest: intArg(t, d, "dest", 0), Err: errArg(t, d, "fail")}
	}
	d.Fatalf(t, "unknown chunk message %q", kind)
	return nil
}

func (w *world) finishMsg(t *testing.T, d *datadriven.TestData, room uint64) *messages.Finish {
	f := &messages.Finish{Room: room, Timeout: durArg(t, d, "timeout", time.Second), Event: ddEvent("finish"), Reply: make(chan messages.Result, 1)}
	if d.HasArg("caller") {
		f.Ctx = context.Background()
	}
	if d.HasArg("abandoned") {
		f.Abandoned = context.Canceled
	}
	return f
}

// deliver steps a chunk core and prints its effects.
func (w *world) deliver(c *ddChunk, msg any) string {
	var b strings.Builder
	w.stepChunk(&b, "", c, msg, true)
	return strings.TrimRight(b.String(), "\n")
}

// stepChunk steps a chunk core and prints its effects, one a line after
// indent; noEffect says whether to print "(no effect)" when there is none.
func (w *world) stepChunk(b *strings.Builder, indent string, c *ddChunk, msg any, noEffect bool) {
	switch m := msg.(type) {
	case *messages.Submitted:
		try := 0
		for _, x := range c.owed {
			if x.Seq == m.Seq && x.Dest == m.Dest {
				try = x.Try
				break
			}
		}
		c.owed = without1(c.owed, m.Seq, m.Dest, -1)
		if n := len(c.early); m.Posted {
			if c.early = without1(c.early, m.Seq, m.Dest, try); len(c.early) == n {
				c.flying = append(c.flying, messages.Work{Seq: m.Seq, Dest: m.Dest, Try: try})
			}
		}
	case *messages.BatchDone:
		n := len(c.flying)
		if c.flying = without1(c.flying, m.Seq, m.Dest, m.Try); len(c.flying) == n {
			c.early = append(c.early, messages.Work{Seq: m.Seq, Dest: m.Dest, Try: m.Try})
		}
	}
	effs := c.core.Step(msg)
	if len(effs) == 0 && noEffect {
		fmt.Fprintf(b, "%s(no effect)\n", indent)
	}
	effs = append([]Effect(nil), effs...) // the room's step must not reuse the slice
	for _, e := range effs {
		fmt.Fprintf(b, "%s%s\n", indent, w.effect(e))
		switch e := e.(type) {
		case Submit:
			c.owed = append(c.owed, e.Work)
		case ChunkEnded:
			// The shell tells the forward actor to forget the chunk only
			// if ChunkEnded says so: the forward of the world must list it
			// nowhere after that.
			if f := w.forward; f != nil {
				if e.Forget {
					f.Step(&messages.Forget{Chunk: e.Result.Chunk})
				}
				if lists(f, e.Result.Chunk) {
					fmt.Fprintf(b, "%s  BUG: the forward still lists the ended chunk\n", indent)
				}
			}
			// The shell tells the room; a room of the world hears it.
			room := e.Result.Chunk.Room
			if r, ok := w.rooms[room]; ok {
				pad := strings.Repeat(" ", len(indent)+2)
				for _, re := range r.Step(&messages.ChunkDone{Result: e.Result}) {
					fmt.Fprintf(b, "%sroom %d: %s\n", pad, room, w.effect(re))
				}
			}
		}
	}
}

// lists reports whether the forward core would still fan a message out to
// chunk x: pending, or bound to a forward that has not ended.
func lists(f *ForwardCore, x messages.Chunk) bool {
	if slices.Contains(f.Pending(), x) {
		return true
	}
	for fw := range f.forwards {
		if slices.Contains(f.Active(fw), x) {
			return true
		}
	}
	return false
}

// without1 removes the first Work (seq, dest) of ws posted as try (-1:
// any).
func without1(ws []messages.Work, seq, dest, try int) []messages.Work {
	for i, x := range ws {
		if x.Seq == seq && x.Dest == dest && (try < 0 || x.Try == try) {
			return append(ws[:i:i], ws[i+1:]...)
		}
	}
	return ws
}

// serve answers the chunk's Work as the submitters and the transport would:
// every Work not answered yet is posted (or fails: fail-seq=, fail=), then
// every batch in flight completes (fail-batch= fails one of them;
// no-completions leaves them in flight). It prints each message it
// delivers, and under it the chunk's effects, if any.
func (w *world) serve(t *testing.T, d *datadriven.TestData) string {
	c := w.chunk(t, d)
	failSeq, failBatch := intArg(t, d, "fail-seq", -2), intArg(t, d, "fail-batch", -2)
	failDest := intArg(t, d, "fail-dest", -1) // -1: every destination
	hit := func(w messages.Work, seq int) bool { return w.Seq == seq && (failDest < 0 || w.Dest == failDest) }
	var b strings.Builder
	for _, work := range append([]messages.Work(nil), c.owed...) {
		m := &messages.Submitted{Seq: work.Seq, Dest: work.Dest, Posted: true, Bytes: 16 * uint64(len(work.Buffers)*c.plan.Owned), Blocks: len(work.Buffers)}
		if hit(work, failSeq) {
			m = &messages.Submitted{Seq: work.Seq, Dest: work.Dest, Err: errArg(t, d, "fail")}
		}
		fmt.Fprintf(&b, "%s\n", message(m))
		w.stepChunk(&b, "  ", c, m, false)
	}
	if !d.HasArg("no-completions") {
		for _, work := range append([]messages.Work(nil), c.flying...) {
			m := &messages.BatchDone{Seq: work.Seq, Dest: work.Dest, Try: work.Try}
			if hit(work, failBatch) {
				m.Err = errArg(t, d, "fail")
				m.Broken = BrokenEndpoint(m.Err)
			}
			fmt.Fprintf(&b, "%s\n", message(m))
			w.stepChunk(&b, "  ", c, m, false)
		}
	}
	if b.Len() == 0 {
		return "nothing to serve"
	}
	return strings.TrimRight(b.String(), "\n")
}

// --- forward, room and manager cores ---

func (w *world) target(t *testing.T, d *datadriven.TestData) Target {
	c := w.chunk(t, d)
	return Target{Chunk: c.plan.Chunk}
}

func (w *world) stepForward(t *testing.T, d *datadriven.TestData) string {
	if w.forward == nil {
		w.forward = NewForwardCore()
	}
	fw := uint64(intArg(t, d, "forward", 1))
	var msg any
	switch kind := kindArg(t, d); kind {
	case "pending":
		msg = &messages.Pending{Chunk: w.target(t, d).Chunk}
	case "begin":
		msg = &messages.Begin{Forward: fw, Bound: make(chan int, 1)}
	case "boundary":
		g := intArg(t, d, "group", 0)
		msg = &messages.Boundary{Forward: fw, Group: g, Event: ddEvent(fmt.Sprintf("f%d.g%d", fw, g))}
	case "end":
		msg = &messages.End{Forward: fw, Event: ddEvent(fmt.Sprintf("f%d.end", fw))}
	case "forget":
		msg = &messages.Forget{Chunk: w.target(t, d).Chunk}
	default:
		d.Fatalf(t, "unknown forward message %q", kind)
	}
	return w.effects(w.forward.Step(msg))
}

func (w *world) room(id uint64) *RoomCore {
	r, ok := w.rooms[id]
	if !ok {
		r = NewRoomCore(id)
		w.rooms[id] = r
	}
	return r
}

func (w *world) stepRoom(t *testing.T, d *datadriven.TestData) string {
	var msg any
	var room uint64
	switch kind := kindArg(t, d); kind {
	case "add":
		c := w.chunk(t, d)
		room = c.plan.Chunk.Room
		msg = &messages.AddChunk{Chunk: c.plan.Chunk, PerLayer: c.plan.Mode == cp.PerLayer, Reply: make(chan messages.Added, 1)}
	case "finish":
		room = uint64(intArg(t, d, "room", 7))
		msg = w.finishMsg(t, d, room)
	case "drop":
		room = uint64(intArg(t, d, "room", 7))
		msg = &messages.Drop{Room: room, Timeout: durArg(t, d, "timeout", time.Second), Reply: make(chan []messages.Result, 1)}
	default:
		d.Fatalf(t, "unknown room message %q", kind)
	}
	return w.effects(w.room(room).Step(msg))
}

func (w *world) stepManager(t *testing.T, d *datadriven.TestData) string {
	if w.manager == nil {
		w.manager = NewManagerCore()
	}
	room := uint64(intArg(t, d, "room", 7))
	var msg any
	switch kind := kindArg(t, d); kind {
	case "add":
		c := w.chunk(t, d)
		msg = &messages.AddChunk{Chunk: c.plan.Chunk, Reply: make(chan messages.Added, 1)}
	case "finish":
		msg = w.finishMsg(t, d, room)
	case "drop":
		msg = &messages.Drop{Room: room, Reply: make(chan []messages.Result, 1)}
	case "room-idle":
		msg = &messages.RoomIdle{Room: room, Seen: uint64(intArg(t, d, "seen", 0))}
	default:
		d.Fatalf(t, "unknown manager message %q", kind)
	}
	return w.effects(w.manager.Step(msg))
}

// effects prints effects; those that deliver a message to a chunk of the
// world deliver it and print the chunk's effects under them.
func (w *world) effects(effs []Effect) string {
	if len(effs) == 0 {
		return "(no effect)"
	}
	effs = append([]Effect(nil), effs...) // a delivery must not reuse the slice
	var b strings.Builder
	for _, e := range effs {
		fmt.Fprintf(&b, "%s\n", w.effect(e))
		switch e := e.(type) {
		case FanOut:
			for _, to := range e.To {
				if c, ok := w.chunks[w.names[to.Chunk]]; ok {
					w.stepChunk(&b, "  "+c.name+": ", c, e.Msg, true)
				}
			}
		case Send:
			if c, ok := w.chunks[w.names[e.To]]; ok {
				w.stepChunk(&b, "  "+c.name+": ", c, e.Msg, true)
			}
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// --- the submit core ---

func (w *world) stepSubmit(t *testing.T, d *datadriven.TestData) string {
	if w.submit == nil {
		d.Fatalf(t, "new-work first")
	}
	var msg any
	switch kind := kindArg(t, d); kind {
	case "wait-ended":
		m := &WaitEnded{Err: errArg(t, d, "fail"), Cancelled: d.HasArg("cancelled")}
		if d.HasArg("peer-lost") {
			m.PeerLost = errors.Mark(errors.Mark(errors.New(`peer "d0" lost`), ErrPeerLost), rdma.ErrEndpointBroken)
		}
		msg = m
	case "post-ended":
		m := &PostEnded{Writes: intArg(t, d, "writes", 8)}
		switch {
		case d.HasArg("posted"):
			m.Posted = true
		case d.HasArg("gate-closed"):
		case d.HasArg("conn-fail"):
			m.ConnErr = errors.New("connect refused")
		default:
			m.Err = errArg(t, d, "fail")
		}
		msg = m
	default:
		d.Fatalf(t, "unknown submit report %q", kind)
	}
	return w.effects(w.submit.Step(msg))
}

// --- printing ---

// effect prints one effect on one line: its type, then what it carries,
// chunks by name, events by name, errors by text and class.
func (w *world) effect(e Effect) string {
	switch e := e.(type) {
	case FanOut:
		names := make([]string, len(e.To))
		for i, to := range e.To {
			names[i] = w.name(to.Chunk)
		}
		return fmt.Sprintf("FanOut %s -> %s", message(e.Msg), strings.Join(names, ", "))
	case AnswerBegin:
		return fmt.Sprintf("AnswerBegin bound=%d", e.N)
	case SpawnRoom:
		return fmt.Sprintf("SpawnRoom %d", e.Room)
	case Route:
		return fmt.Sprintf("Route %s -> room %d", message(e.Msg), e.Room)
	case StopRoom:
		return fmt.Sprintf("StopRoom %d", e.Room)
	case SpawnChunk:
		return fmt.Sprintf("SpawnChunk %s", w.name(e.Add.Chunk))
	case AnswerRegister:
		s := "new"
		if e.Added.Existing {
			s = "existing"
		}
		return fmt.Sprintf("AnswerRegister %s %s", w.name(e.Added.Chunk), s)
	case Unqueue:
		return fmt.Sprintf("Unqueue %s", w.name(e.Chunk))
	case Send:
		return fmt.Sprintf("Send %s -> %s", message(e.Msg), w.name(e.To))
	case StopChunk:
		return fmt.Sprintf("StopChunk %s", w.name(e.Chunk))
	case AnswerDrop:
		rs := make([]string, len(e.Results))
		for i, r := range e.Results {
			rs[i] = w.result(r)
		}
		return fmt.Sprintf("AnswerDrop [%s]", strings.Join(rs, "; "))
	case Idle:
		return fmt.Sprintf("Idle seen=%d", e.Seen)
	case Submit:
		return "Submit " + work(e.Work)
	case StartTimer:
		s := "StartTimer after=" + e.After.String()
		if e.Caller != nil {
			s += " watching-caller"
		}
		return s
	case CancelWork:
		return "CancelWork"
	case Teardown:
		return "Teardown"
	case Resend:
		if e.After > 0 {
			return fmt.Sprintf("Resend %s after=%s", part(e.Seq, e.Dest), e.After)
		}
		return fmt.Sprintf("Resend %s", part(e.Seq, e.Dest))
	case WatchBatch:
		return fmt.Sprintf("WatchBatch %s%s after=%s", part(e.Seq, e.Dest), tryText(e.Try), e.After)
	case ChunkEnded:
		s := fmt.Sprintf("ChunkEnded %s, logged at %s", w.result(e.Result), LogLevel(e.Result))
		if e.Forget {
			s += ", the forward told to forget it"
		}
		return s
	case AnswerFinish:
		s := "AnswerFinish " + w.result(e.Result)
		if e.Result.Chunk.Serial != 0 {
			st := e.Result.Stats
			s += fmt.Sprintf(" (groups=%d batches=%d bytes=%d ignored=%d", st.Groups, st.Batches, st.Bytes, st.Ignored)
			if st.Resent > 0 {
				s += fmt.Sprintf(" resent=%d", st.Resent)
			}
			if st.Overdue > 0 {
				s += fmt.Sprintf(" overdue=%d", st.Overdue)
			}
			s += ")"
		}
		return s
	case PostBatch:
		return fmt.Sprintf("PostBatch try=%d", e.Try)
	case Disconnect:
		return "Disconnect " + e.Peer
	case AnswerWork:
		if e.Err != nil {
			return fmt.Sprintf("AnswerWork %s: %s", e.Outcome, errText(e.Err)) + classes(e.Err)
		}
		return "AnswerWork " + e.Outcome.String()
	case Restart:
		return fmt.Sprintf("Restart (endpoint to %s: %s)", e.Peer, e.Cause)
	case Escalate:
		return fmt.Sprintf("Escalate (%s)", e.Cause) + classes(e.Cause)
	case Stray:
		return fmt.Sprintf("Stray %s seq=%d dest=%d", e.What, e.Seq, e.Dest)
	}
	return fmt.Sprintf("%T (not printable yet)", e)
}

func (w *world) name(c messages.Chunk) string {
	if n, ok := w.names[c]; ok {
		return n
	}
	return fmt.Sprintf("%d:%d-%d#%d", c.Room, c.Start, c.End, c.Serial)
}

func (w *world) result(r messages.Result) string {
	s := r.Status.String()
	if r.Chunk.Serial != 0 {
		s = w.name(r.Chunk) + " " + s
	}
	if r.Err != nil {
		s += ": " + r.Err.Error() + classes(r.Err)
	}
	return s
}

// classes names the marks an error carries, as callers test them.
func classes(err error) string {
	var cs []string
	for _, c := range []struct {
		name string
		mark error
	}{
		{"bad input", ErrBadInput}, {"timeout", ErrTimeout}, {"cancelled", ErrCancelled},
		{"event wait", ErrEventWait}, {"device lost", cuda.ErrDeviceLost}, {"peer lost", ErrPeerLost},
		{"endpoint broken", rdma.ErrEndpointBroken}, {"not quiesced", rdma.ErrNotQuiesced}, {"fenced", rdma.ErrFenced},
		{"revoked", rdma.ErrRevoked}, {"resend limit", ErrResendLimit},
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

func message(m any) string {
	switch m := m.(type) {
	case *messages.Bind:
		return fmt.Sprintf("Bind forward=%d", m.Forward)
	case *messages.GroupReady:
		return fmt.Sprintf("GroupReady forward=%d group=%d event=%s", m.Forward, m.Group, m.Event)
	case *messages.ForwardEnd:
		return fmt.Sprintf("ForwardEnd forward=%d event=%s", m.Forward, m.Event)
	case *messages.Finish:
		return fmt.Sprintf("Finish room=%d timeout=%s", m.Room, m.Timeout)
	case *messages.Drop:
		return fmt.Sprintf("Drop room=%d", m.Room)
	case *messages.AddChunk:
		return fmt.Sprintf("AddChunk room=%d [%d, %d)", m.Chunk.Room, m.Chunk.Start, m.Chunk.End)
	case *messages.Submitted:
		switch {
		case m.Err != nil:
			return fmt.Sprintf("Submitted %s failed: %s", part(m.Seq, m.Dest), m.Err)
		case m.Posted:
			return fmt.Sprintf("Submitted %s posted", part(m.Seq, m.Dest))
		}
		return fmt.Sprintf("Submitted %s skipped", part(m.Seq, m.Dest))
	case *messages.BatchDone:
		if m.Err != nil {
			return fmt.Sprintf("BatchDone %s%s failed: %s", part(m.Seq, m.Dest), tryText(m.Try), m.Err)
		}
		return fmt.Sprintf("BatchDone %s%s", part(m.Seq, m.Dest), tryText(m.Try))
	}
	return fmt.Sprintf("%T", m)
}

// tryText names a re-send's post of its Work; the first post says nothing.
func tryText(try int) string {
	if try == 0 {
		return ""
	}
	return fmt.Sprintf(" (try %d)", try)
}

func work(x messages.Work) string {
	seq := strconv.Itoa(x.Seq)
	if x.Seq == messages.Rest {
		seq = "rest"
	}
	s := fmt.Sprintf("seq=%s dest=%d buffers=%s event=%s", seq, x.Dest, ranges(x.Buffers), x.Event)
	if x.Try > 0 {
		s += fmt.Sprintf(" try=%d", x.Try)
	}
	return s
}

// ranges prints buffer indexes compactly: 0-7, or 0-3,8-11.
func ranges(xs []int) string {
	if len(xs) == 0 {
		return "none"
	}
	xs = append([]int(nil), xs...)
	sort.Ints(xs)
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(xs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", xs[i], xs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
