package landguard

import (
	"fmt"
	"sort"
	"sync"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
)

// Dest is where a write lands: a decode rank's buffer and page.
type Dest struct{ Rank, Buffer, Page int }

// Key is the page's owner key (PageKey).
func (d Dest) Key() int { return PageKey(d.Rank, d.Page) }

// PageKey is the owner key of decode rank r's page: the unit a chunk
// registers (every buffer of the page).
func PageKey(r, page int) int { return r<<32 | page }

// Pools is the decode side a run writes: every buffer of every decode
// rank, sorted by address for a binary search (Locate runs on every write
// of every batch, on the engine's critical path: a scan over every buffer
// per write would sit in front of each landing).
type Pools struct {
	regions []region
	pools   []*testbed.Decode
	name    func(Dest) string
}

// region is one decode buffer's pages on one decode rank.
type region struct {
	base, end    uint64
	rank, buffer int
	itemLen      uint64
}

// NewPools indexes pools, by decode rank. name names a buffer in a
// violation; nil names it by the pool's buffer name and, with several
// ranks, the rank.
func NewPools(pools []*testbed.Decode, name func(Dest) string) *Pools {
	p := &Pools{pools: pools, name: name}
	for r, pool := range pools {
		per := pool.ItemLen * uint64(pool.Pages)
		for b, base := range pool.Bases {
			p.regions = append(p.regions, region{base: base, end: base + per, rank: r, buffer: b, itemLen: pool.ItemLen})
		}
	}
	sort.Slice(p.regions, func(i, j int) bool { return p.regions[i].base < p.regions[j].base })
	if p.name == nil {
		p.name = func(d Dest) string {
			if len(pools) == 1 {
				return pools[0].Names[d.Buffer]
			}
			return fmt.Sprintf("%s of decode rank %d", pools[d.Rank].Names[d.Buffer], d.Rank)
		}
	}
	return p
}

// Locate returns the decode rank, buffer and page that addr falls in.
func (p *Pools) Locate(addr uint64) (Dest, bool) {
	rs := p.regions
	i := sort.Search(len(rs), func(i int) bool { return rs[i].end > addr })
	if i == len(rs) || addr < rs[i].base {
		return Dest{}, false
	}
	rg := rs[i]
	return Dest{Rank: rg.rank, Buffer: rg.buffer, Page: int((addr - rg.base) / rg.itemLen)}, true
}

// Name names d's buffer.
func (p *Pools) Name(d Dest) string { return p.name(d) }

// pageBytes is what one page of decode rank r holds across its buffers:
// what a chunk must land there per page it registers, exactly once.
func (p *Pools) pageBytes(r int) uint64 {
	return uint64(len(p.pools[r].Bases)) * p.pools[r].ItemLen
}

// Oracle is a run's transport oracle: one Guard per prefill rank's
// transport, and the bytes every chunk landed on each decode rank, summed
// over the prefill ranks that registered it.
//
// The byte check alone has two blind spots. The loopback may copy a
// batch's bytes into place ahead of its modeled landing (so that its own
// copy does not delay modeled time), so an engine that answers SUCCESS
// with a batch still in flight finds the bytes in place and passes: each
// Guard fails a SUCCESS before every batch of its chunk landed, and a
// batch posted into a chunk that already finished. And a sender that
// writes the right bytes twice (every TP replica of a replicated head
// sending, say) leaves the pools equal: the Oracle compares the bytes
// each decode rank received for a chunk with what its pages need (every
// buffer of every page the chunk registered, once), and fails any excess
// or shortfall. Bytes count when their batch completed: a failed batch
// that was posted again counts once.
type Oracle struct {
	pools *Pools

	mu     sync.Mutex
	guards []*Guard
	chunks map[[2]int]*ledgerChunk
}

// ledgerChunk is one chunk's bytes, over every prefill rank.
type ledgerChunk struct {
	room, start, end      int
	keys                  map[int]struct{} // decode page keys it registered
	landed                map[int]uint64   // decode rank -> bytes of completed batches
	registered, succeeded int              // prefill ranks
}

// New returns the oracle of a run writing pools.
func New(pools *Pools) *Oracle {
	return &Oracle{pools: pools, chunks: map[[2]int]*ledgerChunk{}}
}

// Wrap returns tr as the engine of the next prefill rank sees it: every
// batch it posts checked.
func (o *Oracle) Wrap(tr rdma.Transport) *Guard {
	g := &Guard{Transport: tr, o: o, owner: map[int]pageOwner{}, chunks: map[[2]int]*guardChunk{}}
	o.mu.Lock()
	o.guards = append(o.guards, g)
	o.mu.Unlock()
	return g
}

// Violations returns what the guards caught, in order, naming the prefill
// rank where there are several, then every excess or shortfall of a chunk
// that every prefill rank registering it finished with SUCCESS.
func (o *Oracle) Violations() []string {
	o.mu.Lock()
	guards := append([]*Guard(nil), o.guards...)
	o.mu.Unlock()
	var out []string
	for i, g := range guards {
		for _, v := range g.violations() {
			if len(guards) > 1 {
				v = fmt.Sprintf("prefill rank %d: %s", i, v)
			}
			out = append(out, v)
		}
	}
	return append(out, o.ledgerViolations()...)
}

func (o *Oracle) ledgerViolations() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := make([][2]int, 0, len(o.chunks))
	for k := range o.chunks {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	var out []string
	for _, k := range keys {
		c := o.chunks[k]
		if c.succeeded < c.registered {
			continue // failed or dropped somewhere: its bytes are not promised
		}
		need := map[int]uint64{}
		pages := map[int]int{}
		for key := range c.keys {
			r := key >> 32
			need[r] += o.pools.pageBytes(r)
			pages[r]++
		}
		ranks := make([]int, 0, len(need)+len(c.landed))
		for r := range need {
			ranks = append(ranks, r)
		}
		for r := range c.landed {
			if _, ok := need[r]; !ok {
				ranks = append(ranks, r)
			}
		}
		sort.Ints(ranks)
		for _, r := range ranks {
			if got, want := c.landed[r], need[r]; got != want {
				out = append(out, fmt.Sprintf("room %d chunk %d-%d decode rank %d: %d bytes landed, its %d registered pages need %d (%s)",
					c.room, c.start, c.end, r, got, pages[r], want, excess(got, want)))
			}
		}
	}
	return out
}

// excess says how far got is from want.
func excess(got, want uint64) string {
	if got > want {
		s := fmt.Sprintf("%d bytes too many", got-want)
		if want > 0 && got%want == 0 {
			s += fmt.Sprintf(": every byte %d times", got/want)
		}
		return s
	}
	return fmt.Sprintf("%d bytes missing", want-got)
}

// register counts a prefill rank's registration of a chunk.
func (o *Oracle) register(room, start, end int, keys []int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.chunks[[2]int{room, start}]
	if c == nil {
		c = &ledgerChunk{room: room, start: start, end: end, keys: map[int]struct{}{}, landed: map[int]uint64{}}
		o.chunks[[2]int{room, start}] = c
	}
	c.registered++
	for _, k := range keys {
		c.keys[k] = struct{}{}
	}
}

func (o *Oracle) succeeded(room, start int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c := o.chunks[[2]int{room, start}]; c != nil {
		c.succeeded++
	}
}

func (o *Oracle) landed(room, start, rank int, bytes uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c := o.chunks[[2]int{room, start}]; c != nil {
		c.landed[rank] += bytes
	}
}

// Guard is one prefill rank's transport as its engine sees it: it sees
// every batch the engine posts and every completion the link reports (at
// the batch's modeled landing instant), and records a violation when a
// chunk's Finish returns SUCCESS before each of its batches landed, or
// when a batch is posted into a chunk that already finished. Violations
// name room, chunk, position, decode page and buffer.
type Guard struct {
	rdma.Transport
	o *Oracle

	mu     sync.Mutex
	owner  map[int]pageOwner // decode page key -> the chunk registered to write it
	chunks map[[2]int]*guardChunk
	errs   []string
}

// pageOwner is the chunk (and request position) a decode page belongs to.
type pageOwner struct {
	chunk    *guardChunk
	position int
}

// guardChunk is one registered chunk as the guard follows it.
type guardChunk struct {
	room, start, end int
	inFlight         map[*guardBatch]struct{}
	finished         bool
}

// guardBatch is a posted batch not yet completed: its first write, to name
// it in a violation, and its bytes, for the ledger.
type guardBatch struct {
	dest     Dest
	position int
	bytes    uint64         // to dest's decode rank
	others   map[int]uint64 // to other decode ranks (none where an endpoint reaches one rank)
}

// Expect registers a chunk: room's positions, whose decode pages have the
// keys keys[i] (PageKey; one per position, or one per position and decode
// rank: keys[i*ranks+r], ranks = len(keys)/len(positions)). A decode page
// taken over by a later request (its slot) changes owner here, after the
// earlier one was released.
func (g *Guard) Expect(room, start, end int, positions, keys []int) {
	g.o.register(room, start, end, keys)
	g.mu.Lock()
	defer g.mu.Unlock()
	c := &guardChunk{room: room, start: start, end: end, inFlight: map[*guardBatch]struct{}{}}
	g.chunks[[2]int{room, start}] = c
	if len(positions) == 0 {
		return
	}
	per := len(keys) / len(positions)
	for i, k := range keys {
		g.owner[k] = pageOwner{chunk: c, position: positions[i/per]}
	}
}

// Finished is told that room's chunk at start returned from Finish with
// SUCCESS: every batch posted for it must have landed.
func (g *Guard) Finished(room, start int) {
	g.o.succeeded(room, start)
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.chunks[[2]int{room, start}]
	if c == nil {
		g.fail(fmt.Sprintf("room %d chunk at token %d: Finish SUCCESS for a chunk never registered", room, start))
		return
	}
	c.finished = true
	for b := range c.inFlight {
		g.fail(fmt.Sprintf("room %d chunk %d-%d position %d (decode page %d) buffer %s: Finish returned SUCCESS with %d batch(es) of the chunk still in flight (not landed at its modeled instant)",
			room, c.start, c.end, b.position, b.dest.Page, g.o.pools.Name(b.dest), len(c.inFlight)))
		return
	}
}

// violations returns what the guard caught, in order.
func (g *Guard) violations() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.errs...)
}

func (g *Guard) fail(msg string) { g.errs = append(g.errs, msg) }

// Connect wraps the endpoint so that the guard sees its batches.
func (g *Guard) Connect(addr []byte) (rdma.Endpoint, error) {
	ep, err := g.Transport.Connect(addr)
	if err != nil {
		return nil, err
	}
	return &guardedEndpoint{Endpoint: ep, g: g}, nil
}

type guardedEndpoint struct {
	rdma.Endpoint
	g *Guard
}

// Post records the batch in its chunk (named by its first write: the engine
// posts one batch per chunk, group and destination) before handing it on,
// and takes it off when the link reports it; the bytes of a batch that
// completed count for its chunk on its decode rank.
func (e *guardedEndpoint) Post(ws []rdma.Write, done func(error)) error {
	g := e.g
	if len(ws) == 0 {
		return e.Endpoint.Post(ws, done)
	}
	gb := &guardBatch{dest: Dest{Page: -1}, position: -1}
	g.mu.Lock()
	var c *guardChunk
	for i, w := range ws {
		d, ok := g.o.pools.Locate(w.Dst)
		o, owned := g.owner[d.Key()]
		switch {
		case !ok:
			g.fail(fmt.Sprintf("write %d of a batch: destination %#x is in no decode buffer", i, w.Dst))
			continue
		case !owned:
			g.fail(fmt.Sprintf("decode page %d buffer %s: written by a batch of no registered chunk", d.Page, g.o.pools.Name(d)))
			continue
		}
		if c == nil {
			c = o.chunk
			gb.dest, gb.position = d, o.position
		}
		if d.Rank == gb.dest.Rank {
			gb.bytes += w.Len
		} else {
			if gb.others == nil {
				gb.others = map[int]uint64{}
			}
			gb.others[d.Rank] += w.Len
		}
		if o.chunk.finished {
			g.fail(fmt.Sprintf("room %d chunk %d-%d position %d (decode page %d) buffer %s: a batch posted after the chunk's Finish returned SUCCESS",
				o.chunk.room, o.chunk.start, o.chunk.end, o.position, d.Page, g.o.pools.Name(d)))
			break
		}
	}
	if c != nil {
		c.inFlight[gb] = struct{}{}
	}
	g.mu.Unlock()
	err := e.Endpoint.Post(ws, func(err error) {
		if c != nil {
			g.mu.Lock()
			delete(c.inFlight, gb)
			g.mu.Unlock()
			if err == nil {
				g.o.landed(c.room, c.start, gb.dest.Rank, gb.bytes)
				for r, n := range gb.others {
					g.o.landed(c.room, c.start, r, n)
				}
			}
		}
		done(err)
	})
	if err != nil && c != nil {
		// Nothing of the batch started: done will not run.
		g.mu.Lock()
		delete(c.inFlight, gb)
		g.mu.Unlock()
	}
	return err
}
