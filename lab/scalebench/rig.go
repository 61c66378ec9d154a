package scalebench

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// ItemLen is bytes per page per buffer: DeepSeek-V3's MLA latent, 576 bf16
// values, one token per page.
const ItemLen = 1152

// GroupSize is K, hook layers per group, at every point.
const GroupSize = 8

// rig is an engine over layers MLA buffers (one per hook layer) of pages
// pages each, with dests decode peers, on the null transport and a stream
// whose events are complete at once. No buffer has memory behind it.
type rig struct {
	eng    *system.Engine
	tr     *nullTransport
	obs    *countObserver
	layers int
	dests  int
	pages  int
}

// countObserver counts completed batches and signals when want of them did.
type countObserver struct {
	system.NopObserver
	mu   sync.Mutex
	n    int
	want int
	err  error
	done chan struct{}
}

func (o *countObserver) Batch(b system.Batch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if b.Err != nil && o.err == nil {
		o.err = b.Err
	}
	o.n++
	if o.n == o.want && o.done != nil {
		close(o.done)
		o.done = nil
	}
}

// expect arms the observer for want more batches and returns the channel
// closed when they completed.
func (o *countObserver) expect(want int) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	ch := make(chan struct{})
	o.want = o.n + want
	o.done = ch
	if want == 0 {
		close(ch)
		o.done = nil
	}
	return ch
}

func (o *countObserver) failed() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

func bufferBase(b int) uint64 { return uint64(b+1) << 40 }

func peerID(d int) string { return "d" + strconv.Itoa(d) }

func newRig(layers, dests, pages int) (*rig, error) {
	bufs := make([]system.Buffer, layers)
	for i := range bufs {
		bufs[i] = system.Buffer{Name: "KV" + strconv.Itoa(i), Base: bufferBase(i), ItemLen: ItemLen, Pages: pages, Layer: i}
	}
	tr := newNullTransport()
	obs := &countObserver{}
	eng, err := system.New(system.Config{Buffers: bufs, HookLayers: layers, GroupSize: GroupSize, PageSize: 1},
		system.WithStream(doneStream{}), system.WithTransport(tr), system.WithLogger(zap.NewNop()), system.WithObserver(obs))
	if err != nil {
		_ = tr.Close()
		return nil, err
	}
	r := &rig{eng: eng, tr: tr, obs: obs, layers: layers, dests: dests, pages: pages}
	for d := 0; d < dests; d++ {
		p := system.Peer{ID: peerID(d), Address: tr.Address(), Buffers: make([]system.PeerBuffer, layers)}
		for i := range p.Buffers {
			p.Buffers[i] = system.PeerBuffer{Region: rdma.RegionDesc{Addr: bufferBase(i), Len: ItemLen * uint64(pages), Key: []byte{1}}, ItemLen: ItemLen}
		}
		if err := eng.AddPeer(p); err != nil {
			r.close()
			return nil, err
		}
	}
	return r, nil
}

func (r *rig) close() {
	_ = r.eng.Close()
	_ = r.tr.Close()
}

// spec is room's chunk of src pages toward every destination d at
// dsts[d], or at dsts[0] for all when there is one list.
func (r *rig) spec(room uint64, src []int, dsts [][]int) system.ChunkSpec {
	s := system.ChunkSpec{Room: room, End: len(src), Last: true, SrcPages: src, TotalPages: len(src)}
	for d := 0; d < r.dests; d++ {
		dst := dsts[0]
		if len(dsts) > 1 {
			dst = dsts[d]
		}
		s.Infos = append(s.Infos, system.DecodeInfo{Peer: peerID(d), DstPages: dst})
	}
	return s
}

// perDest is dst once per destination, each its own slice, as the decode
// ranks of a TP group send them: lists that share their backing array are
// equal to the plan without being read.
func (r *rig) perDest(dst []int) [][]int {
	out := make([][]int, r.dests)
	for d := range out {
		out[d] = slices.Clone(dst)
	}
	return out
}

// registerRooms registers rooms first..first+n-1, a one-page chunk each
// (page i of the pool on both sides), to every destination.
func (r *rig) registerRooms(ctx context.Context, first uint64, n int) error {
	for i := 0; i < n; i++ {
		pg := []int{i % r.pages}
		if _, err := r.eng.Register(ctx, r.spec(first+uint64(i), pg, [][]int{pg})); err != nil {
			return err
		}
	}
	return nil
}

// batchesPerForward is how many batches a forward posts for chunks chunks:
// one per group per destination (the groups cover every buffer).
func (r *rig) batchesPerForward(chunks int) int {
	groups := (r.layers + GroupSize - 1) / GroupSize
	return chunks * r.dests * groups
}

// endForward calls LayerEnd from layer from on and End, then waits until
// landed is closed.
func (r *rig) endForward(ctx context.Context, fw *system.Forward, from int, landed <-chan struct{}) error {
	for l := from; l < r.layers; l++ {
		if err := fw.LayerEnd(l); err != nil {
			return err
		}
	}
	if err := fw.End(); err != nil {
		return err
	}
	select {
	case <-landed:
	case <-ctx.Done():
		return errors.Wrap(ctx.Err(), "waiting for the forward's batches")
	}
	return r.obs.failed()
}

// finishForward runs begun forward fw over chunks bound chunks to its end
// and waits until their batches completed.
func (r *rig) finishForward(ctx context.Context, fw *system.Forward, chunks int) error {
	return r.endForward(ctx, fw, 0, r.obs.expect(r.batchesPerForward(chunks)))
}

// forward runs one forward over the bound chunks and waits until their
// batches completed.
func (r *rig) forward(ctx context.Context, chunks int) error {
	landed := r.obs.expect(r.batchesPerForward(chunks))
	fw, err := r.eng.BeginForward()
	if err != nil {
		return err
	}
	return r.endForward(ctx, fw, 0, landed)
}

// boundaryCycle is one forward of boundaryCycle's.
type boundaryCycle struct {
	wallNs float64       // the forward thread's time per repeated boundary
	cpu    time.Duration // the process's CPU time from the first repeat to the last batch
	allocs uint64        // heap allocations over the same span
}

// boundaryCycle registers rooms one-page chunks from room first, begins a
// forward, ends its first group, ends it again reps times, then runs the
// forward to its last batch and finishes the rooms.
func (r *rig) boundaryCycle(ctx context.Context, first uint64, rooms, reps int) (boundaryCycle, error) {
	var c boundaryCycle
	if err := r.registerRooms(ctx, first, rooms); err != nil {
		return c, err
	}
	landed := r.obs.expect(r.batchesPerForward(rooms))
	fw, err := r.eng.BeginForward()
	if err != nil {
		return c, err
	}
	b := min(GroupSize, r.layers) - 1
	for l := 0; l <= b; l++ {
		if err := fw.LayerEnd(l); err != nil {
			return c, err
		}
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := cpuTime()
	start := time.Now()
	for i := 0; i < reps; i++ {
		if err := fw.LayerEnd(b); err != nil {
			return c, err
		}
	}
	if reps > 0 {
		c.wallNs = float64(time.Since(start).Nanoseconds()) / float64(reps)
	}
	if err := r.endForward(ctx, fw, b+1, landed); err != nil {
		return c, err
	}
	c.cpu = cpuTime() - cpu0
	runtime.ReadMemStats(&m1)
	c.allocs = m1.Mallocs - m0.Mallocs
	return c, r.finishRooms(ctx, first, rooms)
}

// endCycle is what endCycle measures: the process's CPU time and the wall
// time from a forward's last boundary to the last of its rooms' Finish
// returned.
type endCycle struct{ cpu, wall time.Duration }

// endCycle registers rooms one-page chunks from room first and runs a
// forward to its last group, whose batches landed before the cycle is
// timed. Then, from the last boundary, it ends the forward and hands each
// room to a goroutine of its own that calls Finish, as a serving stack's
// transfer worker per request does once the forward ended: what is
// measured is every room's last group and the answers, all that a room
// costs after the forward.
func (r *rig) endCycle(ctx context.Context, first uint64, rooms int) (endCycle, error) {
	var c endCycle
	if err := r.registerRooms(ctx, first, rooms); err != nil {
		return c, err
	}
	groups := (r.layers + GroupSize - 1) / GroupSize
	early := r.obs.expect(rooms * r.dests * (groups - 1))
	fw, err := r.eng.BeginForward()
	if err != nil {
		return c, err
	}
	last := (groups-1)*GroupSize - 1 // the boundary before the last group
	for l := 0; l <= last; l++ {
		if err := fw.LayerEnd(l); err != nil {
			return c, err
		}
	}
	select {
	case <-early:
	case <-ctx.Done():
		return c, errors.Wrap(ctx.Err(), "waiting for the forward's early groups")
	}
	landed := r.obs.expect(rooms * r.dests)
	start, abort := make(chan struct{}), make(chan struct{})
	errs := make(chan error, rooms)
	for i := 0; i < rooms; i++ {
		room := first + uint64(i)
		go func() {
			select {
			case <-start:
			case <-abort: // the forward failed: no Finish, the rig's error says why
				errs <- nil
				return
			}
			res, err := r.eng.Finish(ctx, room)
			if err == nil && res.Status != system.Succeeded {
				err = errors.Newf("room %d finished %v, want success", room, res.Status)
			}
			errs <- err
		}()
	}
	cpu0 := cpuTime()
	t0 := time.Now()
	for l := last + 1; l < r.layers; l++ {
		if err := fw.LayerEnd(l); err != nil {
			close(abort)
			return c, err
		}
	}
	if err := fw.End(); err != nil {
		close(abort)
		return c, err
	}
	close(start)
	var ferr error
	for i := 0; i < rooms; i++ {
		ferr = errors.CombineErrors(ferr, <-errs)
	}
	c.wall, c.cpu = time.Since(t0), cpuTime()-cpu0
	if ferr != nil {
		return c, ferr
	}
	select {
	case <-landed: // every batch of the last group was counted
	case <-ctx.Done():
		return c, errors.Wrap(ctx.Err(), "waiting for the forward's last group")
	}
	return c, r.obs.failed()
}

// finishRooms finishes rooms first..first+n-1 and checks they succeeded.
func (r *rig) finishRooms(ctx context.Context, first uint64, n int) error {
	for i := 0; i < n; i++ {
		res, err := r.eng.Finish(ctx, first+uint64(i))
		if err != nil {
			return err
		}
		if res.Status != system.Succeeded {
			return errors.Newf("room %d finished %v, want success", first+uint64(i), res.Status)
		}
	}
	return nil
}
