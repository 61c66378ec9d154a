package scalebench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/cockroachdb/errors"
)

// The axes a sweep varies, one at a time around Config.Base.
const (
	AxisRooms         = "rooms"
	AxisDestinations  = "destinations"
	AxisLayers        = "layers"
	AxisFragmentation = "fragmentation"
)

// ChunkPages is the chunk whose plan and writes are measured: 100k tokens
// at one token per page.
const ChunkPages = 100_000

// Point is one place on the curve.
type Point struct {
	Rooms  int `json:"rooms"`        // chunks bound to one forward, one room each
	Dests  int `json:"destinations"` // decode destinations per chunk
	Layers int `json:"layers"`       // hook layers, one MLA buffer each, K = GroupSize
	Frag   int `json:"fragmentation"`
	// Frag is the length of the runs of consecutive decode pages of the
	// 100k-page chunk (1: every page its own run).
}

// Config is one sweep.
type Config struct {
	Base                       Point
	Rooms, Dests, Layers, Frag []int // each axis's values; nil or empty: not swept
	// Budget is about how long one timed loop runs.
	Budget time.Duration
	// Sim measures exposed ÷ floor with `kvstream sim` at the points it can
	// model (rooms, destinations as decode TP, layers), the median of
	// SimRuns runs (a single run's figure can be one stall of the machine).
	Sim     bool
	SimRuns int
	// Progress, if set, gets a line as each point starts.
	Progress io.Writer
}

// Full is the sweep the issue asks for.
func Full() Config {
	return Config{
		Base:  Point{Rooms: 16, Dests: 1, Layers: 64, Frag: 16},
		Rooms: []int{1, 4, 16, 64, 256, 1024}, Dests: []int{1, 2, 4, 8, 16, 32},
		Layers: []int{8, 16, 32, 64, 128}, Frag: []int{1, 4, 16, 64},
		Budget: 200 * time.Millisecond, Sim: true, SimRuns: 3,
	}
}

// Quick is a reduced sweep that takes well under a minute.
func Quick() Config {
	return Config{
		Base:  Point{Rooms: 16, Dests: 1, Layers: 16, Frag: 16},
		Rooms: []int{1, 64, 1024}, Dests: []int{1, 8, 32},
		Layers: []int{8, 128}, Frag: []int{1, 64},
		Budget: 20 * time.Millisecond, Sim: true, SimRuns: 1,
	}
}

// Row is one point's figures. Times are nanoseconds unless named otherwise;
// allocations and bytes are the whole process's (what other goroutines did
// because of the measured call included).
type Row struct {
	Axis  string `json:"axis"`
	Value int    `json:"value"`
	// LayerEndNs is the forward thread's time in a non-boundary LayerEnd.
	LayerEndNs float64 `json:"layer_end_ns"`
	// BoundaryNs is the forward thread's time in a boundary LayerEnd with
	// Rooms chunks bound (event record, one queue entry per chunk host);
	// BoundaryNsPerContext is it per chunk bound (the measure).
	// BoundaryCPUNsPerContext is the whole fan-out's CPU time, every
	// thread's (the forward thread, the hosts stepping each chunk's core),
	// per chunk bound: what the hosts do off the forward thread is still
	// paid there.
	BoundaryNs              float64 `json:"boundary_ns"`
	BoundaryNsPerContext    float64 `json:"boundary_ns_per_context"`
	BoundaryCPUNsPerContext float64 `json:"boundary_cpu_ns_per_context"`
	// BoundaryAllocs is heap allocations per boundary, every goroutine's
	// until the chunks took the message.
	BoundaryAllocs float64 `json:"boundary_allocs"`
	// AllocsPerForward is heap allocations from BeginForward to every
	// batch of the forward completed, with Rooms one-page chunks bound.
	AllocsPerForward float64 `json:"allocs_per_forward"`
	// BytesPerRoom is live heap per registered, bound room (a one-page
	// chunk to every destination), its page lists excluded.
	BytesPerRoom float64 `json:"bytes_per_room"`
	// EndCPUNsPerRoom is the process's CPU time, every thread's, from a
	// forward's last boundary to the last of its rooms' Finish returned,
	// per room (one-page chunks, a goroutine per room calling Finish once
	// the forward ended, the null transport completing every batch at
	// once): what each room costs the engine after the forward, which the
	// exposure of a forward with many rooms pays on the processors the
	// machine has. EndWallNsPerRoom is the same span's wall time per room.
	// The median of endCycles forwards.
	EndCPUNsPerRoom  float64 `json:"end_cpu_ns_per_room"`
	EndWallNsPerRoom float64 `json:"end_wall_ns_per_room"`
	// PlanMs is the registration of the 100k-page chunk (the plan, and
	// the copy of its spec the engine keeps), the median of at least five.
	PlanMs float64 `json:"plan_ms"`
	// WritesPerGroup is the writes posted per group of the 100k-page chunk,
	// every destination's; NsPerWrite is the process's CPU time per write
	// posted, from BeginForward to the last batch completed.
	WritesPerGroup float64 `json:"writes_per_group"`
	NsPerWrite     float64 `json:"ns_per_write"`
	// ExposedOverFloor is the sim's per-layer exposure of the forward over
	// its floor (forwardRatio); null where the sim was not run or cannot
	// model the axis (fragmentation).
	ExposedOverFloor *float64 `json:"exposed_over_floor"`
	// SimLinkLagMs is how late the sim's emulated link landed the per-layer
	// run's batches after their modeled instants (p99 over the batches of
	// the run whose ratio is the median; the max under 100 batches): the
	// emulator competing for the processors with the engine and the sim.
	// Every landing after a late one is as late, so exposed ÷ floor
	// carries it: where it is a large part of the floor the ratio is not
	// the engine's alone.
	SimLinkLagMs *float64 `json:"sim_link_lag_ms,omitempty"`
	// Point is where the row was taken.
	Point Point `json:"point"`
}

// Report is a sweep's result.
type Report struct {
	Base Point `json:"base"`
	Rows []Row `json:"rows"`
	// Slopes are the fitted growth exponents (Slopes).
	Slopes []Slope `json:"slopes,omitempty"`
}

// Validate checks a sweep's values.
func (c Config) Validate() error {
	check := func(name string, v, lo, hi int) error {
		if v < lo || v > hi {
			return errors.Newf("scale bench: %s %d: must be %d to %d", name, v, lo, hi)
		}
		return nil
	}
	for _, p := range c.points() {
		for _, err := range []error{
			check("rooms", p.pt.Rooms, 1, 4096), check("destinations", p.pt.Dests, 1, 64),
			check("layers", p.pt.Layers, 1, 256), check("fragmentation", p.pt.Frag, 1, ChunkPages),
		} {
			if err != nil {
				return err
			}
		}
	}
	if c.Sim {
		for _, p := range c.points() {
			if p.pt.Rooms > SimForwardTokens/SimPageSize {
				return errors.Newf("scale bench: rooms %d: the sim splits a forward of %d tokens over the rooms, at least a page of %d each: at most %d rooms (or no sim)",
					p.pt.Rooms, SimForwardTokens, SimPageSize, SimForwardTokens/SimPageSize)
			}
		}
	}
	if c.Sim && (c.SimRuns < 1 || c.SimRuns > 99) {
		return errors.Newf("scale bench: sim runs %d: must be 1 to 99", c.SimRuns)
	}
	if c.Budget <= 0 {
		return errors.Newf("scale bench: budget %v: must be positive", c.Budget)
	}
	return nil
}

// Only keeps one axis of the sweep (AxisRooms, AxisDestinations,
// AxisLayers or AxisFragmentation) and drops the others: what one change
// moves can be measured alone, and more often in the same minutes.
func (c *Config) Only(axis string) error {
	keep := map[string]*[]int{AxisRooms: &c.Rooms, AxisDestinations: &c.Dests, AxisLayers: &c.Layers, AxisFragmentation: &c.Frag}
	if _, ok := keep[axis]; !ok {
		return errors.Newf("scale bench: axis %q: want %s, %s, %s or %s", axis, AxisRooms, AxisDestinations, AxisLayers, AxisFragmentation)
	}
	for name, vals := range keep {
		if name != axis {
			*vals = nil
		}
	}
	return nil
}

type axisPoint struct {
	axis  string
	value int
	pt    Point
}

func (c Config) points() []axisPoint {
	var out []axisPoint
	add := func(axis string, vals []int, set func(*Point, int)) {
		for _, v := range vals {
			p := c.Base
			set(&p, v)
			out = append(out, axisPoint{axis: axis, value: v, pt: p})
		}
	}
	add(AxisRooms, c.Rooms, func(p *Point, v int) { p.Rooms = v })
	add(AxisDestinations, c.Dests, func(p *Point, v int) { p.Dests = v })
	add(AxisLayers, c.Layers, func(p *Point, v int) { p.Layers = v })
	add(AxisFragmentation, c.Frag, func(p *Point, v int) { p.Frag = v })
	return out
}

// Run measures every point of the sweep.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{Base: cfg.Base}
	// Figures that do not depend on the axis varied are measured once per
	// distinct input and shared.
	engine := map[[3]int]engineFigures{}
	writes := map[[3]int]writeFigures{}
	sims := map[[3]int]exposure{}
	for _, ap := range cfg.points() {
		p := ap.pt
		if cfg.Progress != nil {
			_, _ = fmt.Fprintf(cfg.Progress, "%s %d: rooms %d, destinations %d, layers %d, fragmentation %d\n", ap.axis, ap.value, p.Rooms, p.Dests, p.Layers, p.Frag)
		}
		row := Row{Axis: ap.axis, Value: ap.value, Point: p}
		ek := [3]int{p.Rooms, p.Dests, p.Layers}
		ef, ok := engine[ek]
		if !ok {
			var err error
			if ef, err = measureEngine(ctx, p, cfg.Budget); err != nil {
				return nil, errors.Wrapf(err, "scale bench: engine at %+v", p)
			}
			engine[ek] = ef
		}
		row.LayerEndNs, row.BoundaryNs, row.BoundaryAllocs = ef.layerEnd, ef.boundary, ef.boundaryAllocs
		row.BoundaryNsPerContext = ef.boundary / float64(p.Rooms)
		row.BoundaryCPUNsPerContext = ef.boundaryCPU / float64(p.Rooms)
		row.AllocsPerForward, row.BytesPerRoom = ef.allocsPerForward, ef.bytesPerRoom
		row.EndCPUNsPerRoom, row.EndWallNsPerRoom = ef.endCPU, ef.endWall
		wk := [3]int{p.Dests, p.Layers, p.Frag}
		wf, ok := writes[wk]
		if !ok {
			var err error
			if wf, err = measureWrites(ctx, p, cfg.Budget); err != nil {
				return nil, errors.Wrapf(err, "scale bench: writes at %+v", p)
			}
			writes[wk] = wf
		}
		row.WritesPerGroup, row.NsPerWrite, row.PlanMs = wf.perGroup, wf.nsPerWrite, wf.planMs
		if cfg.Sim && ap.axis != AxisFragmentation {
			sk := [3]int{p.Rooms, p.Dests, p.Layers}
			r, ok := sims[sk]
			if !ok {
				var err error
				if r, err = measureExposure(ctx, p, cfg.SimRuns); err != nil {
					return nil, errors.Wrapf(err, "scale bench: sim at %+v", p)
				}
				sims[sk] = r
			}
			row.ExposedOverFloor, row.SimLinkLagMs = &r.ratio, &r.lagMs
		}
		rep.Rows = append(rep.Rows, row)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	rep.Slopes = Slopes(rep)
	return rep, nil
}

// engineFigures are what a rig with rooms one-page chunks measures.
type engineFigures struct {
	layerEnd, boundary, boundaryCPU, boundaryAllocs float64
	allocsPerForward, bytesPerRoom                  float64
	endCPU, endWall                                 float64 // per room
}

// endCycles is how many forwards the end of a forward is measured over.
const endCycles = 5

// heapRooms is the fewest rooms the heap per room is measured over.
const heapRooms = 256

// boundaryMessages bounds the messages one boundary loop leaves in the
// chunks' mailboxes.
const boundaryMessages = 1 << 20

func measureEngine(ctx context.Context, p Point, budget time.Duration) (engineFigures, error) {
	var f engineFigures
	r, err := newRig(p.Layers, p.Dests, max(p.Rooms, heapRooms))
	if err != nil {
		return f, err
	}
	defer r.close()
	// A first forward warms the engine: actors, submitters, endpoints.
	room := uint64(1)
	if err := r.registerRooms(ctx, room, p.Rooms); err != nil {
		return f, err
	}
	if err := r.forward(ctx, p.Rooms); err != nil {
		return f, err
	}
	if err := r.finishRooms(ctx, room, p.Rooms); err != nil {
		return f, err
	}
	room += uint64(p.Rooms)

	if err := r.registerRooms(ctx, room, p.Rooms); err != nil {
		return f, err
	}
	landed := r.obs.expect(r.batchesPerForward(p.Rooms))
	fw, err := r.eng.BeginForward()
	if err != nil {
		return f, err
	}

	// Non-boundary LayerEnd: every layer of the first group but its last.
	nb := min(GroupSize, p.Layers) - 1
	if nb > 0 {
		res, err := timeLoop(budget, 1000, 1<<30, func(n int) error {
			for i := 0; i < n; i++ {
				if err := fw.LayerEnd(i % nb); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return f, err
		}
		f.layerEnd = res.ns
	}
	if err := r.endForward(ctx, fw, 0, landed); err != nil {
		return f, err
	}
	if err := r.finishRooms(ctx, room, p.Rooms); err != nil {
		return f, err
	}
	room += uint64(p.Rooms)

	// Boundary LayerEnd: a forward whose first boundary comes again n
	// times (each chunk acts on the first and ignores the repeats), against
	// the same forward with no repeat. The forward thread's time is the
	// repeats' loop; the fan-out's whole cost (CPU time of every thread,
	// allocations: the hosts' queues, the chunks taking the message)
	// is the difference between the two forwards, each run to its last
	// batch. The least of two of each.
	n := min(max(boundaryMessages/p.Rooms, 10), 2000)
	cpuBest, allocBest := -1.0, -1.0
	for i := 0; i < 2; i++ {
		var c [2]boundaryCycle
		for j, reps := range []int{0, n} {
			if c[j], err = r.boundaryCycle(ctx, room, p.Rooms, reps); err != nil {
				return f, err
			}
			room += uint64(p.Rooms)
		}
		if i == 0 || c[1].wallNs < f.boundary {
			f.boundary = c[1].wallNs
		}
		if cpu := float64((c[1].cpu - c[0].cpu).Nanoseconds()) / float64(n); cpuBest < 0 || cpu < cpuBest {
			cpuBest = cpu
		}
		if allocs := (float64(c[1].allocs) - float64(c[0].allocs)) / float64(n); allocBest < 0 || allocs < allocBest {
			allocBest = allocs
		}
	}
	f.boundaryCPU, f.boundaryAllocs = max(cpuBest, 0), max(allocBest, 0)

	// Heap per room: registered and bound to a forward, against the heap
	// just before; at least heapRooms rooms, so that a few kilobytes of
	// noise do not decide the figure. The median of three.
	nh := max(p.Rooms, heapRooms)
	var bytes []float64
	for i := 0; i < 3; i++ {
		idle := heapInUse()
		if err := r.registerRooms(ctx, room, nh); err != nil {
			return f, err
		}
		fw, err := r.eng.BeginForward()
		if err != nil {
			return f, err
		}
		bound := heapInUse()
		// The page lists of a one-page chunk: its source pages and its
		// destinations', as the engine's copy of the spec holds them (one
		// 8-byte allocation each; the destinations' lists are equal, so
		// the copy holds one for all of them).
		lists := 8 * float64(1+1)
		bytes = append(bytes, (float64(bound)-float64(idle))/float64(nh)-lists)
		if err := r.finishForward(ctx, fw, nh); err != nil {
			return f, err
		}
		if err := r.finishRooms(ctx, room, nh); err != nil {
			return f, err
		}
		room += uint64(nh)
	}
	slices.Sort(bytes)
	f.bytesPerRoom = bytes[1]

	// Allocations per forward: the least of three.
	for i := 0; i < 3; i++ {
		if err := r.registerRooms(ctx, room, p.Rooms); err != nil {
			return f, err
		}
		res, err := timeOnce(1, func(int) error { return r.forward(ctx, p.Rooms) })
		if err != nil {
			return f, err
		}
		if i == 0 || res.allocs < f.allocsPerForward {
			f.allocsPerForward = res.allocs
		}
		if err := r.finishRooms(ctx, room, p.Rooms); err != nil {
			return f, err
		}
		room += uint64(p.Rooms)
	}

	// The end of a forward, per room: the median of endCycles.
	var cpus, walls []float64
	for i := 0; i < endCycles; i++ {
		c, err := r.endCycle(ctx, room, p.Rooms)
		if err != nil {
			return f, err
		}
		cpus = append(cpus, float64(c.cpu.Nanoseconds())/float64(p.Rooms))
		walls = append(walls, float64(c.wall.Nanoseconds())/float64(p.Rooms))
		room += uint64(p.Rooms)
	}
	slices.Sort(cpus)
	slices.Sort(walls)
	f.endCPU, f.endWall = cpus[endCycles/2], walls[endCycles/2]
	return f, r.obs.failed()
}

// fragmented returns the decode pages of an n-page chunk in runs of frag
// consecutive pages, the runs in a shuffled order in which no run is
// followed by the run that continues it, so that the chunk has exactly
// ceil(n / frag) runs.
func fragmented(n, frag int) []int {
	runs := (n + frag - 1) / frag
	order := make([]int, runs)
	for i := range order {
		order[i] = i
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(runs, func(i, j int) { order[i], order[j] = order[j], order[i] })
	// A run directly followed by its successor would merge: swap the
	// successor with the run after it (or the first), until none is left.
	if runs == 2 {
		order[0], order[1] = 1, 0
	}
	for changed := true; changed && runs > 2; {
		changed = false
		for i := 0; i+1 < runs; i++ {
			if order[i+1] == order[i]+1 {
				j := (i + 2) % runs
				order[i+1], order[j] = order[j], order[i+1]
				changed = true
			}
		}
	}
	out := make([]int, 0, n)
	for _, r := range order {
		for pg := r * frag; pg < min((r+1)*frag, n); pg++ {
			out = append(out, pg)
		}
	}
	return out
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// writeFigures are the 100k-page chunk's plan and writes.
type writeFigures struct {
	perGroup, nsPerWrite, planMs float64
}

// planSamples is the fewest registrations the plan's time is the median of.
const planSamples = 5

func measureWrites(ctx context.Context, p Point, budget time.Duration) (writeFigures, error) {
	var f writeFigures
	r, err := newRig(p.Layers, p.Dests, ChunkPages)
	if err != nil {
		return f, err
	}
	defer r.close()
	src, dsts := seq(ChunkPages), r.perDest(fragmented(ChunkPages, p.Frag))
	room := uint64(1)
	// The plan first, on a heap the forwards below have not grown: Register
	// builds it (plan.BuildPlan, behind the façade), with the copy of the
	// spec the engine keeps; each registration is dropped before the next,
	// untimed.
	runtime.GC()
	var took []time.Duration
	start := time.Now()
	for len(took) < planSamples || (time.Since(start) < budget && len(took) < 1000) {
		t0 := time.Now()
		if _, err := r.eng.Register(ctx, r.spec(room, src, dsts)); err != nil {
			return f, err
		}
		took = append(took, time.Since(t0))
		if err := r.eng.Drop(ctx, room); err != nil {
			return f, err
		}
		room++
	}
	slices.Sort(took)
	f.planMs = float64(took[len(took)/2].Nanoseconds()) / 1e6

	best := -1.0
	for i := 0; i < 2; i++ { // the first forward warms the submitters' slices
		if _, err := r.eng.Register(ctx, r.spec(room, src, dsts)); err != nil {
			return f, err
		}
		w0, cpu0 := r.tr.writes.Load(), cpuTime()
		if err := r.forward(ctx, 1); err != nil {
			return f, err
		}
		cpu, w := cpuTime()-cpu0, r.tr.writes.Load()-w0
		if err := r.finishRooms(ctx, room, 1); err != nil {
			return f, err
		}
		room++
		groups := (p.Layers + GroupSize - 1) / GroupSize
		f.perGroup = float64(w) / float64(groups)
		if ns := float64(cpu.Nanoseconds()) / float64(w); best < 0 || ns < best {
			best = ns
		}
	}
	f.nsPerWrite = best

	return f, nil
}
