package actors

import (
	"slices"

	"github.com/kvstream/kvstream/messages"
)

// RoomCore keeps one room's chunk contexts. Queued contexts form a FIFO in
// send order (invariant 7): registering an active key is a no-op, a new key
// appends, finish pops the front, drop drains every queued context.
type RoomCore struct {
	room  uint64
	queue []queued
	// finishing are the chunks popped by Finish or by a Drop that have not
	// ended: a later Drop must reach them too (and wait for them), or their
	// writes could land after it returned.
	finishing []queued
	live      int // queued + finishing
	drops     []*dropWait
	seen      uint64
	out       []Effect
}

type queued struct {
	chunk    messages.Chunk
	perLayer bool
	peers    []string // decode peers of its real destinations
}

type dropWait struct {
	to      chan<- []messages.Result
	waiting map[messages.Chunk]bool
	results []messages.Result
}

// NewRoomCore returns the core of an empty room.
func NewRoomCore(room uint64) *RoomCore { return &RoomCore{room: room} }

// Queue returns the queued chunks in FIFO order (for tests).
func (c *RoomCore) Queue() []messages.Chunk {
	out := make([]messages.Chunk, len(c.queue))
	for i, q := range c.queue {
		out[i] = q.chunk
	}
	return out
}

// Step feeds one message; the returned slice is reused by the next call.
func (c *RoomCore) Step(msg any) []Effect {
	c.out = c.out[:0]
	switch m := msg.(type) {
	case *messages.AddChunk:
		c.seen++
		c.add(m)
	case *messages.Finish:
		c.seen++
		c.finish(m)
	case *messages.Drop:
		c.seen++
		c.drop(m)
	case *messages.ChunkDone:
		c.ended(m.Result)
	default:
		return c.out
	}
	if c.live == 0 && len(c.drops) == 0 {
		c.out = append(c.out, Idle{Seen: c.seen})
	}
	return c.out
}

// Release lets go of what an idle core still references: its last effects
// (its room's messages and their callers' reply channels) and the arrays of
// its emptied queues. A core with a chunk or a Drop waiting keeps all.
func (c *RoomCore) Release() {
	if c.live != 0 || len(c.drops) != 0 {
		return
	}
	clear(c.out[:cap(c.out)])
	c.out = c.out[:0]
	c.queue, c.finishing, c.drops = nil, nil, nil
}

func (c *RoomCore) add(m *messages.AddChunk) {
	for _, q := range c.queue {
		if q.chunk.ChunkKey == m.Chunk.ChunkKey {
			// Never overwrite an active context: the scheduler re-registers
			// the same chunk many times while forming a batch.
			c.out = append(c.out, AnswerRegister{To: m.Reply, Added: messages.Added{Chunk: q.chunk, PerLayer: q.perLayer, Existing: true}})
			return
		}
	}
	c.queue = append(c.queue, queued{chunk: m.Chunk, perLayer: m.PerLayer, peers: m.Peers})
	c.live++
	c.out = append(c.out, SpawnChunk{Add: m}, AnswerRegister{To: m.Reply, Added: messages.Added{Chunk: m.Chunk, PerLayer: m.PerLayer}})
}

func (c *RoomCore) finish(m *messages.Finish) {
	if len(c.queue) == 0 {
		c.out = append(c.out, AnswerFinish{To: m.Reply, Result: messages.Result{
			Status: messages.Failed,
			Err:    noChunk(c.room, "finish"),
		}})
		return
	}
	front := c.queue[0]
	c.queue = c.queue[1:]
	c.finishing = append(c.finishing, front)
	c.out = append(c.out, Unqueue{Chunk: front.chunk}, Send{To: front.chunk, Msg: m})
}

func (c *RoomCore) drop(m *messages.Drop) {
	if m.Peer != "" && !c.sendsTo(m.Peer) {
		c.out = append(c.out, AnswerDrop{To: m.Reply, Results: []messages.Result{{Status: messages.Failed, Err: noChunk(c.room, "drop toward peer "+m.Peer)}}})
		return
	}
	w := &dropWait{to: m.Reply, waiting: map[messages.Chunk]bool{}}
	for _, q := range c.queue {
		w.waiting[q.chunk] = true
		c.out = append(c.out, Unqueue{Chunk: q.chunk}, Send{To: q.chunk, Msg: m})
	}
	// A chunk being finished is dropped too: its Finish then answers
	// DROPPED, and this Drop waits until its writes quiesced. So is one an
	// earlier Drop took out of the queue and that has not ended yet (a
	// chunk ignores a second Drop): this Drop too returns only once its
	// writes quiesced, not at once as for a room with no chunk.
	for _, f := range c.finishing {
		w.waiting[f.chunk] = true
		c.out = append(c.out, Send{To: f.chunk, Msg: m})
	}
	c.finishing = append(c.finishing, c.queue...)
	c.queue = nil
	if len(w.waiting) == 0 {
		c.out = append(c.out, AnswerDrop{To: m.Reply, Results: []messages.Result{{Status: messages.Failed, Err: noChunk(c.room, "drop")}}})
		return
	}
	c.drops = append(c.drops, w)
}

// sendsTo reports whether a live chunk of the room has a destination on
// the decode peer.
func (c *RoomCore) sendsTo(peer string) bool {
	for _, l := range [][]queued{c.queue, c.finishing} {
		for _, q := range l {
			if slices.Contains(q.peers, peer) {
				return true
			}
		}
	}
	return false
}

func (c *RoomCore) ended(r messages.Result) {
	c.live--
	for i, f := range c.finishing {
		if f.chunk == r.Chunk {
			c.finishing = append(c.finishing[:i:i], c.finishing[i+1:]...)
			break
		}
	}
	for i, q := range c.queue {
		if q.chunk == r.Chunk { // ended while queued (cannot happen today; keep the FIFO honest)
			c.queue = append(c.queue[:i:i], c.queue[i+1:]...)
			c.out = append(c.out, Unqueue{Chunk: r.Chunk})
			break
		}
	}
	c.out = append(c.out, StopChunk{Chunk: r.Chunk})
	for i := 0; i < len(c.drops); i++ {
		w := c.drops[i]
		if !w.waiting[r.Chunk] {
			continue
		}
		delete(w.waiting, r.Chunk)
		w.results = append(w.results, r)
		if len(w.waiting) == 0 {
			c.out = append(c.out, AnswerDrop{To: w.to, Results: w.results})
			c.drops = append(c.drops[:i], c.drops[i+1:]...)
			i--
		}
	}
}
