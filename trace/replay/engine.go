package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/internal/testbed"
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

// Engine replays the trace's façade calls (AddPeer, Register, forwards,
// Finish, Drop) through a fresh engine on the simulated GPU and the
// loopback transport, re-injecting a failure into every chunk that failed
// in the recording, and compares statuses and destination bytes.
func Engine(ctx context.Context, t *trace.Trace) (*EngineOutcome, error) {
	c := t.Header.Config
	if _, err := Layout(c); err != nil {
		return nil, err
	}
	maxPages := 0
	for _, b := range c.Buffers {
		maxPages = max(maxPages, b.Pages)
	}
	if len(c.Buffers) == 0 {
		return nil, errors.New("trace header: no buffers")
	}
	geom := testbed.Geometry{ItemLen: c.Buffers[0].ItemLen, Pages: maxPages}
	for _, b := range c.Buffers {
		if b.ItemLen != geom.ItemLen {
			return nil, errors.Newf("engine replay needs one item length for every buffer; buffer %s has %d, not %d", b.Name, b.ItemLen, geom.ItemLen)
		}
		geom.Names, geom.Layers = append(geom.Names, b.Name), append(geom.Layers, b.Layer)
	}
	recorded, failing, err := recordedOutcomes(t)
	if err != nil {
		return nil, err
	}

	decodes := map[string]*testbed.Decode{}
	inj := &injector{failing: failing, dst: map[string]map[uint64]string{}, done: map[string]bool{}, decodes: decodes}
	fab := loopback.NewFabric(loopback.Options{})
	lb, err := fab.NewTransport("prefill")
	if err != nil {
		return nil, err
	}
	pre := rdmafault.Wrap(lb, inj.fault)
	defer pre.Close()
	pool, err := testbed.NewPool(geom)
	if err != nil {
		return nil, err
	}
	defer pool.Free()
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	stream := gpu.NewStream("compute")
	rule, _ := cp.ParseRule(c.CPRule)
	eng, err := system.New(system.Config{Buffers: pool.EngineBuffers(), HookLayers: c.HookLayers, GroupSize: c.GroupSize, PageSize: c.PageSize,
		CP: cp.CP{Size: c.CPSize, Rank: c.CPRank, Rule: rule}, Submitters: c.Submitters, FinishTimeout: replayTimeout, DisablePerLayer: !c.PerLayer},
		system.WithStream(stream), system.WithTransport(pre), system.WithLogger(zap.NewNop()), system.WithGetenv(func(string) string { return "" }))
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	model := &testbed.Model{Stream: stream, Pool: pool, HookLayers: c.HookLayers, Seed: 11,
		LayerTime: func(int) time.Duration { return 100 * time.Microsecond }}

	defer func() {
		for _, d := range decodes {
			_ = d.Transport.Close()
			_ = d.Free()
		}
	}()
	var pendingWrites []testbed.Write
	var specs []system.ChunkSpec
	// One transfer worker per room finishes its chunks in call order, as a
	// serving stack's transfer path does; the replay loop never blocks on a
	// chunk whose forward it has not replayed yet.
	var mu sync.Mutex
	replayed := map[uint64][]string{}
	results := map[uint64][]system.Result{}
	workers := map[uint64]chan func(){}
	var wg sync.WaitGroup
	onRoom := func(room uint64, f func()) {
		q, ok := workers[room]
		if !ok {
			q = make(chan func(), 1024)
			workers[room] = q
			wg.Add(1)
			go func() {
				defer wg.Done()
				for f := range q {
					f()
				}
			}()
		}
		q <- f
	}
	finish := func(room uint64) func() {
		return func() {
			res, err := eng.Finish(ctx, room)
			mu.Lock()
			defer mu.Unlock()
			if res.Chunk.Serial == 0 && err != nil {
				replayed[room] = append(replayed[room], "ERROR")
				return
			}
			replayed[room] = append(replayed[room], res.Status.String())
			results[room] = append(results[room], res)
		}
	}
	drop := func(room uint64) func() {
		return func() {
			if err := eng.Drop(ctx, room); err == nil {
				mu.Lock()
				replayed[room] = append(replayed[room], dropped(recorded[room], replayed[room])...)
				mu.Unlock()
			}
		}
	}
	for i := range t.Records {
		rec := &t.Records[i]
		switch {
		case rec.Actor == trace.Engine && rec.Type == "AddPeerCall":
			var call trace.AddPeerCall
			if err := remarshal(rec.Msg, &call); err != nil {
				return nil, errors.Wrapf(err, "record %d", rec.Seq)
			}
			if call.Err != "" || len(call.Pages) == 0 {
				continue
			}
			tr, err := fab.NewTransport(call.ID)
			if err != nil {
				return nil, err
			}
			pg := geom
			pg.Pages = call.Pages[0]
			d, err := testbed.NewDecode(tr, pg)
			if err != nil {
				return nil, err
			}
			inj.mu.Lock()
			decodes[call.ID] = d
			inj.mu.Unlock()
			if err := eng.AddPeer(d.Peer(call.ID)); err != nil {
				return nil, errors.Wrapf(err, "record %d: AddPeer %s", rec.Seq, call.ID)
			}
		case rec.Actor == trace.Engine && rec.Type == "RegisterCall":
			var call trace.RegisterCall
			if err := remarshal(rec.Msg, &call); err != nil {
				return nil, errors.Wrapf(err, "record %d", rec.Seq)
			}
			if call.Err != "" || call.Existing {
				continue
			}
			spec := system.ChunkSpec{Room: call.Room, Start: call.Start, End: call.End, Last: call.Last, SrcPages: call.SrcPages, TotalPages: call.TotalPages}
			for _, in := range call.Infos {
				spec.Infos = append(spec.Infos, system.DecodeInfo{Peer: in.Peer, DstPages: in.DstPages, Dummy: in.Dummy})
			}
			reg, err := eng.Register(ctx, spec)
			if err != nil {
				return nil, errors.Wrapf(err, "record %d: replayed Register", rec.Seq)
			}
			inj.watch(call, reg.Chunk)
			rg, _ := cp.ChunkRange(spec.Start, spec.End, c.PageSize, spec.Last)
			pendingWrites = append(pendingWrites, testbed.Write{Room: spec.Room, PageStart: rg.PageStart, SrcPages: rg2src(spec, rg), Tokens: rg.End - rg.Start})
			specs = append(specs, spec)
		case rec.Actor == trace.Forward && rec.Type == "Begin":
			if err := model.Forward(eng, pendingWrites); err != nil {
				return nil, errors.Wrapf(err, "record %d: replayed forward", rec.Seq)
			}
			pendingWrites = nil
		case rec.Actor == trace.Manager && rec.Type == "Finish":
			m, err := trace.Decode(rec)
			if err != nil {
				return nil, err
			}
			room := m.(*messages.Finish).Room
			onRoom(room, finish(room))
		case rec.Actor == trace.Manager && rec.Type == "Drop":
			m, err := trace.Decode(rec)
			if err != nil {
				return nil, err
			}
			room := m.(*messages.Drop).Room
			onRoom(room, drop(room))
		}
	}
	for _, q := range workers {
		close(q)
	}
	wg.Wait()
	out := &EngineOutcome{Recorded: render(recorded), Replayed: render(replayed), Chunks: len(specs)}
	if strings.Join(out.Recorded, "\n") != strings.Join(out.Replayed, "\n") {
		out.Mismatch = "chunk statuses differ"
		return out, nil
	}
	out.Mismatch = checkBytes(specs, results, decodes, pool, c, model.Seed)
	return out, nil
}

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

func remarshal(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, to)
}

// recordedOutcomes reads every chunk's recorded status from its ChunkEnded
// effect, and which chunks failed (they get a failure injected).
func recordedOutcomes(t *trace.Trace) (map[uint64][]string, map[string]string, error) {
	statuses := map[uint64][]string{}
	failing := map[string]string{}
	for _, rec := range t.Records {
		if rec.Actor != trace.Chunk {
			continue
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
				return nil, nil, errors.Wrapf(err, "record %d: ChunkEnded", rec.Seq)
			}
			c, err := trace.ParseChunkID(ended.Result.Chunk)
			if err != nil {
				return nil, nil, err
			}
			if ended.Result.Status != "DROPPED" {
				statuses[c.Room] = append(statuses[c.Room], ended.Result.Status)
			} else {
				statuses[c.Room] = append(statuses[c.Room], "DROPPED")
			}
			if ended.Result.Status == "FAILED" {
				failing[fmt.Sprintf("%d:%d", c.Room, c.Start)] = ended.Result.Chunk
			}
		}
	}
	return statuses, failing, nil
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
	rule, _ := cp.ParseRule(c.CPRule)
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
		rg, _ := cp.ChunkRange(s.Start, s.End, c.PageSize, s.Last)
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
