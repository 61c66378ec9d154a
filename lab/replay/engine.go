package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/system"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
)

// EngineOutcome is a replay through a real engine.
type EngineOutcome struct {
	// Recorded and Replayed are the chunk statuses, per room in finish
	// order ("room r: SUCCESS FAILED ...").
	Recorded, Replayed []string
	// Mismatch describes the first status or byte difference ("" if none).
	Mismatch string
	Chunks   int
}

// replayTimeout bounds Finish in an engine replay: a recorded timeout is
// reproduced without waiting the production timeout.
const replayTimeout = 2 * time.Second

// MaxEngineBytes bounds the memory an engine replay allocates for pools:
// the prefill pool of the header's geometry and a decode pool per peer the
// trace adds. The replay runs on a laptop beside other work and the
// scenario traces need kilobytes; a production geometry (tens of GiB) is
// replayed through the cores only.
const MaxEngineBytes = 4 << 30

// Engine replays the trace's façade calls (AddPeer, Register, forwards,
// Finish, Drop) through a fresh engine on the simulated GPU and the
// loopback transport, re-injecting a failure into every chunk that failed
// in the recording, and compares statuses and destination bytes.
//
// open is called twice and must return the trace from its beginning each
// time: a first pass reads the recorded outcomes (a chunk's failure is
// recorded after the batches that must fail) and sizes the pools against
// MaxEngineBytes before anything is allocated; a second re-issues the
// calls. Neither holds the trace in memory.
func Engine(ctx context.Context, open func() (trace.Stream, error)) (*EngineOutcome, error) {
	s, err := open()
	if err != nil {
		return nil, err
	}
	if s.Header().Side == trace.SideDecode {
		return nil, errors.New("a decode server's trace: its replay is the decode core's (Cores, kvstream replay without --engine); an engine replay re-issues an engine's calls")
	}
	if sh := s.Header().Config.Sharding; sh != nil {
		return nil, errors.Newf("engine replay: the trace's engine reshards (header \"sharding\": side %v rank %v, replicas %d); the engine replay re-issues calls to an unsharded engine and checks bytes one for one, so it cannot replay it faithfully: replay the cores only (without --engine), which rebuild each peer's route",
			sh.Side, sh.Rank, s.Header().Config.Replicas)
	}
	sv, err := surveyTrace(s)
	if err != nil {
		return nil, err
	}
	if s, err = open(); err != nil {
		return nil, err
	}
	r, err := setupEngine(sv)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if err := r.drive(ctx, s); err != nil {
		return nil, err
	}
	return r.compare(), nil
}

// engineReplay is one replay through a real engine: the engine and its
// simulated hardware, the decode pools of the trace's peers, and what the
// replay has issued and collected so far.
type engineReplay struct {
	cfg      trace.Config
	recorded map[uint64][]string // chunk statuses per room, as recorded
	sv       *survey
	geom     testbed.Geometry
	inj      *injector
	fab      *loopback.Fabric
	pool     *testbed.Pool
	eng      *system.Engine
	model    *testbed.Model
	// decodes are the peers' pools by peer id. The injector reads them
	// from transport goroutines, so additions hold inj.mu.
	decodes  map[string]*testbed.Decode
	removed  map[string]bool // peers the replay removed (RemovePeerCall)
	cleanups []func()        // close runs them last first

	pendingWrites []testbed.Write // of the chunks registered since the last forward
	specs         []system.ChunkSpec
	rooms         roomWorkers
}

// engineGeometry is the pool layout an engine replay builds from the
// trace's configuration (validated first); the test bed needs one item
// length for all buffers.
func engineGeometry(c trace.Config) (testbed.Geometry, error) {
	if _, err := Layout(c); err != nil {
		return testbed.Geometry{}, err
	}
	maxPages := 0
	for _, b := range c.Buffers {
		maxPages = max(maxPages, b.Pages)
	}
	geom := testbed.Geometry{ItemLen: c.Buffers[0].ItemLen, Pages: maxPages}
	for _, b := range c.Buffers {
		if b.ItemLen != geom.ItemLen {
			return testbed.Geometry{}, errors.Newf("engine replay needs one item length for every buffer; buffer %s has %d, not %d", b.Name, b.ItemLen, geom.ItemLen)
		}
		geom.Names, geom.Layers = append(geom.Names, b.Name), append(geom.Layers, b.Layer)
	}
	return geom, nil
}

// poolBytes is what a test bed pool of geom with pages pages per buffer
// allocates, added to *total; false when the total passes MaxEngineBytes.
// The factors are bounded by the header's validation (item length 2^28,
// pages 2^24) and the total is checked after every buffer, so nothing
// wraps around.
func poolBytes(total *uint64, geom testbed.Geometry, pages int) bool {
	per := geom.ItemLen * uint64(pages)
	for range geom.Buffers() {
		*total += per
		if *total > MaxEngineBytes {
			return false
		}
	}
	return true
}

// survey is what the first pass over a trace learns: the validated
// header, the pool geometry, the recorded outcomes, and that the pools fit.
type survey struct {
	header   trace.Header
	geom     testbed.Geometry
	recorded map[uint64][]string // chunk statuses per room
	failing  map[string]string   // "room:start" -> chunk, of the chunks that failed
	// For a trace whose ring dropped records (header dropped > 0): the
	// rooms the trace holds whole, whose first record is a registration
	// that added a chunk, naming peers added in the trace. The others'
	// calls and outcomes are passed over (their beginning is not there).
	partial    bool
	whole      map[uint64]bool
	seen       map[uint64]bool
	peersAdded map[string]bool
}

// room notes a record about a room: whole if its first is a registration
// that added a chunk (add) to peers the trace added.
func (sv *survey) room(room uint64, add bool, infos []trace.InfoCall) {
	if sv.seen[room] {
		return
	}
	sv.seen[room] = true
	ok := add
	for _, in := range infos {
		ok = ok && (in.Dummy || sv.peersAdded[in.Peer])
	}
	sv.whole[room] = ok
}

// skips says whether the replay passes over a room's calls.
func (sv *survey) skips(room uint64) bool { return sv.partial && !sv.whole[room] }

// surveyTrace validates the header, reads every chunk's recorded status and
// checks that the prefill pool and every peer's decode pool fit in
// MaxEngineBytes, before the replay allocates any of them.
func surveyTrace(s trace.Stream) (*survey, error) {
	sv := &survey{header: s.Header(), recorded: map[uint64][]string{}, failing: map[string]string{},
		partial: s.Header().Dropped > 0, whole: map[uint64]bool{}, seen: map[uint64]bool{}, peersAdded: map[string]bool{}}
	c := sv.header.Config
	var err error
	if sv.geom, err = engineGeometry(c); err != nil {
		return nil, err
	}
	var total uint64
	if !poolBytes(&total, sv.geom, sv.geom.Pages) {
		return nil, errors.Newf("engine replay: the prefill pool of the trace header (%d buffers of %d pages of %d bytes) is above the bound of %d bytes; replay the cores only",
			sv.geom.Buffers(), sv.geom.Pages, sv.geom.ItemLen, uint64(MaxEngineBytes))
	}
	for {
		rec, err := s.Next()
		if err == io.EOF {
			return sv, nil
		}
		if err != nil {
			return nil, err
		}
		if rec.Actor == trace.Engine && rec.Type == "AddPeerCall" {
			call, err := c.DecodeCall(&rec)
			if err != nil {
				return nil, err
			}
			peer := call.(*trace.AddPeerCall)
			if peer.Err == "" && peer.Sharding != nil {
				return nil, errors.Newf("%s: engine replay: peer %s reshards (its AddPeer has a sharding); the engine replay gives its decode pools no sharding and checks bytes one for one, so it cannot replay it faithfully: replay the cores only (without --engine)",
					rec.Where(), peer.ID)
			}
			if peer.Err == "" && len(peer.Pages) > 0 && !poolBytes(&total, sv.geom, peer.Pages[0]) {
				return nil, errors.Newf("%s: engine replay: the decode pool of peer %s (%d pages) brings the pools above the bound of %d bytes; replay the cores only",
					rec.Where(), peer.ID, peer.Pages[0], uint64(MaxEngineBytes))
			}
		}
		if sv.partial {
			if err := sv.rooms(&rec); err != nil {
				return nil, err
			}
		}
		if err := sv.outcomes(&rec); err != nil {
			return nil, err
		}
	}
}

// rooms notes, for a trace whose ring dropped records, which rooms it
// holds whole.
func (sv *survey) rooms(rec *trace.Record) error {
	switch {
	case rec.Actor == trace.Engine && (rec.Type == "AddPeerCall" || rec.Type == "RegisterCall"):
		c, err := sv.header.Config.DecodeCall(rec)
		if err != nil {
			return err
		}
		switch call := c.(type) {
		case *trace.AddPeerCall:
			if call.Err == "" {
				sv.peersAdded[call.ID] = true
			}
		case *trace.RegisterCall:
			switch {
			case call.Chunk != "" && !call.Existing && call.Err == "":
				sv.room(call.Room, true, call.Infos)
			case call.Existing:
				sv.room(call.Room, false, nil)
			}
		}
	case rec.Actor == trace.Manager && (rec.Type == "Finish" || rec.Type == "Drop"):
		room, ok := msgUint(rec.Msg, "Room")
		if ok {
			sv.room(room, false, nil)
		}
	case rec.Actor == trace.Chunk:
		if c, err := trace.ParseChunkID(rec.ID); err == nil {
			sv.room(c.Room, false, nil)
		}
	}
	return nil
}

// setupEngine opens a fresh engine of the surveyed configuration on the
// simulated GPU, with a prefill pool on a loopback fabric whose faults
// fail the chunks that failed when recorded. On error it closes what it
// opened.
func setupEngine(sv *survey) (_ *engineReplay, err error) {
	c := sv.header.Config
	geom := sv.geom
	r := &engineReplay{cfg: c, recorded: sv.recorded, sv: sv, geom: geom, decodes: map[string]*testbed.Decode{}, removed: map[string]bool{},
		rooms: roomWorkers{replayed: map[uint64][]string{}, results: map[uint64][]system.Result{}, pending: map[uint64][]func(){}}}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	inj := &injector{failing: sv.failing, dst: map[string]map[uint64]string{}, done: map[string]bool{}, decodes: r.decodes}
	fab := loopback.NewFabric(loopback.Options{})
	r.inj, r.fab = inj, fab
	lb, err := fab.NewTransport("prefill")
	if err != nil {
		return nil, err
	}
	pre := rdmafault.Wrap(lb, inj.fault)
	r.onClose(func() { _ = pre.Close() })
	if r.pool, err = testbed.NewPool(geom); err != nil {
		return nil, err
	}
	r.onClose(func() { _ = r.pool.Free() })
	gpu := sim.New(sim.Options{})
	r.onClose(gpu.Close)
	stream := gpu.NewStream("compute")
	rule, _ := cp.ParseRule(c.CPRule)
	r.eng, err = system.New(system.Config{Buffers: r.pool.EngineBuffers(), HookLayers: c.HookLayers, GroupSize: c.GroupSize, PageSize: c.PageSize,
		CP: cp.CP{Size: c.CPSize, Rank: c.CPRank, Rule: rule}, Submitters: c.Submitters, FinishTimeout: replayTimeout, DisablePerLayer: !c.PerLayer,
		SingleDestinationPerLayer: c.SingleDestination},
		system.WithStream(stream), system.WithTransport(pre), system.WithLogger(zap.NewNop()), system.WithGetenv(func(string) string { return "" }))
	if err != nil {
		return nil, err
	}
	// The room workers stop after the engine closed: a replay that failed
	// half way leaves Finish calls queued, which a closed engine answers
	// at once.
	r.onClose(r.rooms.stop)
	r.onClose(func() { _ = r.eng.Close() })
	r.onClose(func() {
		for _, d := range r.decodes {
			_ = d.Transport.Close()
			_ = d.Free()
		}
	})
	r.model = &testbed.Model{Stream: stream, Pool: r.pool, HookLayers: c.HookLayers, Seed: 11,
		LayerTime: func(int) time.Duration { return 100 * time.Microsecond }}
	return r, nil
}

// onClose registers a cleanup; close runs the latest first, as defers do.
func (r *engineReplay) onClose(f func()) { r.cleanups = append(r.cleanups, f) }

// close releases the decode pools, the engine, the GPU, the prefill pool
// and its transport, in that order.
func (r *engineReplay) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

// drive re-issues the trace's façade calls in record order, then waits
// for every room's finishes.
func (r *engineReplay) drive(ctx context.Context, s trace.Stream) error {
	for {
		rec, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := r.step(ctx, &rec); err != nil {
			return err
		}
	}
	r.rooms.stop()
	return nil
}

// step re-issues one record's call; records of anything else are not
// calls and are passed over.
func (r *engineReplay) step(ctx context.Context, rec *trace.Record) error {
	switch {
	case rec.Actor == trace.Engine && rec.Type == "AddPeerCall":
		return r.addPeer(rec)
	case rec.Actor == trace.Engine && rec.Type == "RemovePeerCall":
		return r.removePeer(rec)
	case rec.Actor == trace.Engine && rec.Type == "RegisterCall":
		return r.register(ctx, rec)
	case rec.Actor == trace.Forward && rec.Type == "Begin":
		if err := r.model.Forward(r.eng, r.pendingWrites); err != nil {
			return errors.Wrapf(err, "%s: replayed forward", rec.Where())
		}
		r.pendingWrites = nil
	case rec.Actor == trace.Manager && rec.Type == "Finish":
		m, err := trace.Decode(rec)
		if err != nil {
			return errors.Wrapf(err, "%s", rec.Where())
		}
		room := m.(*messages.Finish).Room
		if r.sv.skips(room) {
			return nil // a room whose beginning the ring dropped
		}
		r.rooms.do(room, r.finish(ctx, room))
	case rec.Actor == trace.Manager && rec.Type == "Drop":
		m, err := trace.Decode(rec)
		if err != nil {
			return errors.Wrapf(err, "%s", rec.Where())
		}
		room := m.(*messages.Drop).Room
		if r.sv.skips(room) {
			return nil
		}
		r.rooms.do(room, r.drop(ctx, room))
	}
	return nil
}

// addPeer gives a peer the recording added a decode pool of its recorded
// geometry on the fabric, and adds it to the engine.
func (r *engineReplay) addPeer(rec *trace.Record) error {
	c, err := r.cfg.DecodeCall(rec)
	if err != nil {
		return err
	}
	call := c.(*trace.AddPeerCall)
	if call.Err != "" || len(call.Pages) == 0 {
		return nil
	}
	if r.removed[call.ID] {
		return errors.Newf("%s: engine replay: peer %s is added again after it was removed (a decode server that restarted under its id); the engine replay keeps one decode pool per peer id, which its final check reads: replay the cores only (without --engine)", rec.Where(), call.ID)
	}
	if _, ok := r.decodes[call.ID]; ok {
		return errors.Newf("%s: engine replay: peer %s is added again while it is added (the engine refuses an id it has)", rec.Where(), call.ID)
	}
	tr, err := r.fab.NewTransport(call.ID)
	if err != nil {
		return errors.Wrapf(err, "%s: AddPeer %s", rec.Where(), call.ID)
	}
	pg := r.geom
	pg.Pages = call.Pages[0]
	d, err := testbed.NewDecode(tr, pg)
	if err != nil {
		_ = tr.Close()
		return errors.Wrapf(err, "%s: AddPeer %s", rec.Where(), call.ID)
	}
	r.inj.mu.Lock()
	r.decodes[call.ID] = d
	r.inj.mu.Unlock()
	if err := r.eng.AddPeer(d.Peer(call.ID)); err != nil {
		return errors.Wrapf(err, "%s: AddPeer %s", rec.Where(), call.ID)
	}
	return nil
}

// removePeer re-issues a RemovePeer that succeeded when recorded. The
// peer's decode pool stays: the final check reads what landed there.
func (r *engineReplay) removePeer(rec *trace.Record) error {
	c, err := r.cfg.DecodeCall(rec)
	if err != nil {
		return err
	}
	call := c.(*trace.RemovePeerCall)
	if call.Err != "" {
		return nil
	}
	// Recorded once no chunk sent to the peer any more; replayed, the
	// finishes of those chunks run on their rooms' goroutines and may not
	// have returned yet, though everything they wait for was re-issued
	// before this record. So the removal is tried until they did, within a
	// finish timeout.
	deadline := time.Now().Add(replayTimeout + time.Second)
	for {
		err := r.eng.RemovePeer(call.ID)
		if err == nil {
			break
		}
		if !errors.Is(err, system.ErrBadInput) || time.Now().After(deadline) {
			return errors.Wrapf(err, "%s: RemovePeer %s", rec.Where(), call.ID)
		}
		time.Sleep(time.Millisecond)
	}
	r.removed[call.ID] = true
	return nil
}

// register re-issues a registration that created a chunk when recorded,
// and queues the chunk's pages for the next forward to write.
func (r *engineReplay) register(ctx context.Context, rec *trace.Record) error {
	c, err := r.cfg.DecodeCall(rec)
	if err != nil {
		return err
	}
	call := c.(*trace.RegisterCall)
	if call.Err != "" || call.Existing || r.sv.skips(call.Room) {
		return nil
	}
	spec := system.ChunkSpec{Room: call.Room, Start: call.Start, End: call.End, Last: call.Last, SrcPages: call.SrcPages, TotalPages: call.TotalPages}
	for _, in := range call.Infos {
		spec.Infos = append(spec.Infos, system.DecodeInfo{Peer: in.Peer, DstPages: in.DstPages, Dummy: in.Dummy})
	}
	reg, err := r.eng.Register(ctx, spec)
	if err != nil {
		return errors.Wrapf(err, "%s: replayed Register", rec.Where())
	}
	r.inj.watch(*call, reg.Chunk)
	rg, err := cp.ChunkRange(spec.Start, spec.End, r.cfg.PageSize, spec.Last)
	if err != nil { // the engine accepted it, so it cannot be invalid
		return errors.NewAssertionErrorWithWrappedErrf(err, "%s: a registered chunk's range", rec.Where())
	}
	r.pendingWrites = append(r.pendingWrites, testbed.Write{Room: spec.Room, PageStart: rg.PageStart, SrcPages: rg2src(spec, rg), Tokens: rg.End - rg.Start})
	r.specs = append(r.specs, spec)
	return nil
}

// finish is a room worker's Finish: it notes the status, and the result
// for the byte comparison.
func (r *engineReplay) finish(ctx context.Context, room uint64) func() {
	w := &r.rooms
	return func() {
		res, err := r.eng.Finish(ctx, room)
		w.mu.Lock()
		defer w.mu.Unlock()
		if res.Chunk.Serial == 0 && err != nil {
			w.replayed[room] = append(w.replayed[room], "ERROR")
			return
		}
		w.replayed[room] = append(w.replayed[room], res.Status.String())
		w.results[room] = append(w.results[room], res)
	}
}

// drop is a room worker's Drop: the chunks it ended are those the
// recording shows dropped.
func (r *engineReplay) drop(ctx context.Context, room uint64) func() {
	w := &r.rooms
	return func() {
		if err := r.eng.Drop(ctx, room); err == nil {
			w.mu.Lock()
			w.replayed[room] = append(w.replayed[room], dropped(r.recorded[room], w.replayed[room])...)
			w.mu.Unlock()
		}
	}
}

// compare sets the replayed chunk statuses beside the recorded ones and,
// when they agree, every successful chunk's destination bytes beside the
// model's. Call it after drive.
func (r *engineReplay) compare() *EngineOutcome {
	out := &EngineOutcome{Recorded: render(r.recorded), Replayed: render(r.rooms.replayed), Chunks: len(r.specs)}
	if strings.Join(out.Recorded, "\n") != strings.Join(out.Replayed, "\n") {
		out.Mismatch = "chunk statuses differ"
		return out
	}
	out.Mismatch = checkBytes(r.specs, r.rooms.results, r.decodes, r.pool, r.cfg, r.model.Seed)
	return out
}

// roomWorkers finish each room's chunks in call order, on a goroutine per
// room, as a serving stack's transfer path does: the replay loop never
// blocks on a chunk whose forward it has not replayed yet. A room's
// goroutine ends when its queue is empty, so goroutines follow the rooms
// with calls pending, not every room the trace names.
type roomWorkers struct {
	mu       sync.Mutex
	replayed map[uint64][]string        // statuses per room, in finish order
	results  map[uint64][]system.Result // of the finishes that ended a chunk
	// pending holds the queued calls of the rooms whose goroutine runs: a
	// room has an entry exactly while its goroutine runs.
	pending map[uint64][]func()
	wg      sync.WaitGroup
}

// do queues f on the room's goroutine, starting one if the room has none.
func (w *roomWorkers) do(room uint64, f func()) {
	w.mu.Lock()
	q, running := w.pending[room]
	w.pending[room] = append(q, f)
	w.mu.Unlock()
	if running {
		return
	}
	w.wg.Add(1)
	go w.run(room)
}

// run performs the room's calls in order until none is left.
func (w *roomWorkers) run(room uint64) {
	defer w.wg.Done()
	for {
		w.mu.Lock()
		q := w.pending[room]
		if len(q) == 0 {
			delete(w.pending, room)
			w.mu.Unlock()
			return
		}
		f := q[0]
		q[0] = nil
		w.pending[room] = q[1:]
		w.mu.Unlock()
		f()
	}
}

// stop waits until every room's queued calls ran. Call it when nothing
// more is queued; calling it again does nothing more.
func (w *roomWorkers) stop() { w.wg.Wait() }

// dropped fills in DROPPED for the recorded chunks a drop ended.
func dropped(recorded, replayed []string) []string {
	var out []string
	for i := len(replayed); i < len(recorded); i++ {
		if recorded[i] == "DROPPED" {
			out = append(out, "DROPPED")
		}
	}
	return out
}

func rg2src(spec system.ChunkSpec, rg cp.Range) []int {
	if len(spec.SrcPages) > rg.Pages {
		return spec.SrcPages[:rg.Pages]
	}
	return spec.SrcPages
}

func render(m map[uint64][]string) []string {
	var rooms []uint64
	for r := range m {
		rooms = append(rooms, r)
	}
	sort.Slice(rooms, func(i, j int) bool { return rooms[i] < rooms[j] })
	var out []string
	for _, r := range rooms {
		out = append(out, fmt.Sprintf("room %d: %s", r, strings.Join(m[r], " ")))
	}
	return out
}

// outcomes notes a chunk record's recorded status from its ChunkEnded
// effect, and whether the chunk failed (it gets a failure injected).
func (sv *survey) outcomes(rec *trace.Record) error {
	if rec.Actor != trace.Chunk {
		return nil
	}
	for _, e := range rec.Effects {
		name, body, _ := strings.Cut(e, " ")
		if name != "ChunkEnded" {
			continue
		}
		var ended struct {
			Result struct {
				Chunk, Status string
				Err           *string
			}
		}
		if err := json.Unmarshal([]byte(body), &ended); err != nil {
			return errors.Wrapf(err, "%s: ChunkEnded", rec.Where())
		}
		c, err := trace.ParseChunkID(ended.Result.Chunk)
		if err != nil {
			return errors.Wrapf(err, "%s: ChunkEnded", rec.Where())
		}
		if sv.skips(c.Room) {
			continue
		}
		if ended.Result.Status != "DROPPED" {
			sv.recorded[c.Room] = append(sv.recorded[c.Room], trace.Excerpt(ended.Result.Status, 16))
		} else {
			sv.recorded[c.Room] = append(sv.recorded[c.Room], "DROPPED")
		}
		if ended.Result.Status == "FAILED" {
			sv.failing[fmt.Sprintf("%d:%d", c.Room, c.Start)] = ended.Result.Chunk
		}
	}
	return nil
}

// injector fails the first batch of every chunk that failed when recorded
// (whatever the recorded cause: the statuses are what is compared).
type injector struct {
	mu      sync.Mutex
	failing map[string]string
	dst     map[string]map[uint64]string // decode node -> page -> chunk key
	done    map[string]bool
	decodes map[string]*testbed.Decode
}

func (in *injector) watch(call trace.RegisterCall, _ messages.Chunk) {
	k := fmt.Sprintf("%d:%d", call.Room, call.Start)
	if _, ok := in.failing[k]; !ok {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, info := range call.Infos {
		if info.Dummy {
			continue
		}
		if in.dst[info.Peer] == nil {
			in.dst[info.Peer] = map[uint64]string{}
		}
		for _, p := range info.DstPages {
			in.dst[info.Peer][uint64(p)] = k
		}
	}
}

func (in *injector) fault(b rdmafault.BatchInfo) rdmafault.Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	d := in.decodes[b.To]
	if d == nil || b.Dst < d.Bases[0] {
		return rdmafault.Fault{}
	}
	per := d.ItemLen * uint64(d.Pages)
	page := ((b.Dst - d.Bases[0]) % per) / d.ItemLen
	k, ok := in.dst[b.To][page]
	if !ok || in.done[k] {
		return rdmafault.Fault{}
	}
	in.done[k] = true
	return rdmafault.Fault{Kind: rdmafault.PostError}
}

// checkBytes compares every successful chunk's owned destination pages
// with the model's bytes.
func checkBytes(specs []system.ChunkSpec, results map[uint64][]system.Result, decodes map[string]*testbed.Decode, pool *testbed.Pool, c trace.Config, seed uint64) string {
	rule, err := cp.ParseRule(c.CPRule)
	if err != nil {
		return err.Error()
	}
	rank := cp.CP{Size: c.CPSize, Rank: c.CPRank, Rule: rule}
	ok := map[[2]uint64]bool{}
	for room, rs := range results {
		for _, r := range rs {
			if r.Status == system.Succeeded {
				ok[[2]uint64{room, uint64(r.Chunk.Start)}] = true
			}
		}
	}
	want := make([]byte, pool.ItemLen)
	for _, s := range specs {
		if !ok[[2]uint64{s.Room, uint64(s.Start)}] {
			continue
		}
		rg, err := cp.ChunkRange(s.Start, s.End, c.PageSize, s.Last)
		if err != nil {
			return fmt.Sprintf("room %d chunk %d: %v", s.Room, s.Start, err)
		}
		_, pos, err := rank.Owned(rg2src(s, rg), rg.PageStart, s.TotalPages)
		if err != nil {
			return err.Error()
		}
		for _, in := range s.Infos {
			d := decodes[in.Peer]
			if in.Dummy || d == nil {
				continue
			}
			for _, p := range pos {
				for b := range pool.Layers {
					testbed.Fill(want, seed, s.Room, b, p)
					if !bytes.Equal(want, d.Page(b, in.DstPages[p])) {
						return fmt.Sprintf("room %d chunk %d: decode %s buffer %s position %d: bytes differ", s.Room, s.Start, in.Peer, pool.Names[b], p)
					}
				}
			}
		}
	}
	return ""
}
