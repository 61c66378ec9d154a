package workload

import (
	"fmt"
	"sync"

	"github.com/kvstream/kvstream/hw/rdma"
)

// landGuard is the sim's transport oracle, wrapped around a prefill rank's
// transport below the engine. The byte check alone has a blind spot: the
// loopback may copy a batch's bytes into place ahead of its modeled landing
// (so that its own copy does not delay modeled time), so an engine that
// answers SUCCESS with a batch still in flight would find the bytes in
// place and pass. The guard sees every batch the engine posts and every
// completion the link reports (at the batch's modeled landing instant), and
// fails the run when a chunk's Finish returns SUCCESS before each of its
// batches landed, or when a batch is posted into a chunk that already
// finished. Violations name room, chunk, position, decode page and buffer.
type landGuard struct {
	rdma.Transport
	// locate maps a destination address to the decode rank, buffer and
	// page it writes; name names the buffer in a violation. Post runs
	// locate on every write of every batch, on the engine's critical path:
	// it must not format or allocate (a Sprintf per write put 0.9-2.3 ms
	// of post time per forward in front of a TP 4 -> 8 run's landings).
	locate func(addr uint64) (destPage, bool)
	name   func(destPage) string

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
// it in a violation.
type guardBatch struct {
	dest     destPage
	position int
}

// destPage is where a write lands: a decode rank's buffer and page.
type destPage struct{ rank, buffer, page int }

// key is the page's owner key (pageKey).
func (d destPage) key() int { return pageKey(d.rank, d.page) }

func newLandGuard(tr rdma.Transport, locate func(addr uint64) (destPage, bool), name func(destPage) string) *landGuard {
	return &landGuard{Transport: tr, locate: locate, name: name, owner: map[int]pageOwner{}, chunks: map[[2]int]*guardChunk{}}
}

// pageKey is the owner key of decode rank r's page.
func pageKey(r, page int) int { return r<<32 | page }

// expect registers a chunk: room's positions, whose decode pages have the
// keys keys[i] (one per position, or one per position and decode rank:
// keys[i*ranks+r], ranks = len(keys)/len(positions)). A decode page taken
// over by a later request (its slot) changes owner here, after the
// earlier one was released.
func (g *landGuard) expect(room, start, end int, positions, keys []int) {
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

// finished is told that room's chunk at start returned from Finish with
// SUCCESS: every batch posted for it must have landed.
func (g *landGuard) finished(room, start int) {
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
			room, c.start, c.end, b.position, b.dest.page, g.name(b.dest), len(c.inFlight)))
		return
	}
}

// violations returns what the guard caught, in order.
func (g *landGuard) violations() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.errs...)
}

func (g *landGuard) fail(msg string) { g.errs = append(g.errs, msg) }

// Connect wraps the endpoint so that the guard sees its batches.
func (g *landGuard) Connect(addr []byte) (rdma.Endpoint, error) {
	ep, err := g.Transport.Connect(addr)
	if err != nil {
		return nil, err
	}
	return &guardedEndpoint{Endpoint: ep, g: g}, nil
}

type guardedEndpoint struct {
	rdma.Endpoint
	g *landGuard
}

// Post records the batch in its chunk (named by its first write: the engine
// posts one batch per chunk, group and destination) before handing it on,
// and takes it off when the link reports it.
func (e *guardedEndpoint) Post(ws []rdma.Write, done func(error)) error {
	g := e.g
	if len(ws) == 0 {
		return e.Endpoint.Post(ws, done)
	}
	gb := &guardBatch{dest: destPage{page: -1}, position: -1}
	g.mu.Lock()
	var c *guardChunk
	for i, w := range ws {
		d, ok := g.locate(w.Dst)
		o, owned := g.owner[d.key()]
		switch {
		case !ok:
			g.fail(fmt.Sprintf("write %d of a batch: destination %#x is in no decode buffer", i, w.Dst))
			continue
		case !owned:
			g.fail(fmt.Sprintf("decode page %d buffer %s: written by a batch of no registered chunk", d.page, g.name(d)))
			continue
		}
		if c == nil {
			c = o.chunk
			gb.dest, gb.position = d, o.position
		}
		if o.chunk.finished {
			g.fail(fmt.Sprintf("room %d chunk %d-%d position %d (decode page %d) buffer %s: a batch posted after the chunk's Finish returned SUCCESS",
				o.chunk.room, o.chunk.start, o.chunk.end, o.position, d.page, g.name(d)))
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
