package actors

// Urgency ranks a Work whose event completed, for the submitters to take
// the most urgent first when several are ready at once (one event gates
// the same group of every chunk its forward feeds). A request's last chunk
// goes first: that request's time to first token is being paid from the
// forward's end until its last batch lands, while a request with chunks to
// come has a forward's time to spare. Among equals, the chunk registered
// first goes first, then the Work that reached a submitter first.
type Urgency struct {
	// Last: the Work's chunk is its request's last.
	Last bool
	// Serial is the chunk's registration serial (messages.Chunk.Serial).
	Serial uint64
	// Arrival orders Works as they reached the submitters.
	Arrival uint64
}

// Before reports whether u goes before v.
func (u Urgency) Before(v Urgency) bool {
	if u.Last != v.Last {
		return u.Last
	}
	if u.Serial != v.Serial {
		return u.Serial < v.Serial
	}
	return u.Arrival < v.Arrival
}

// UrgencyOf is w's urgency, arrival being its arrival number.
func UrgencyOf(w *Work, arrival uint64) Urgency {
	u := Urgency{Serial: w.Chunk.Serial, Arrival: arrival}
	if w.Job != nil && w.Job.Plan != nil {
		u.Last = w.Job.Plan.Range.Last
	}
	return u
}

// ReadyQueue holds the ids of Works whose wait ended and that no submitter
// has taken yet; Pop gives the most urgent. It is the submitters' ordering
// decision in a plain type: no goroutines, no clocks, no hardware (the
// submitter shell waits, queues and posts). The queue is short (the Works
// of the chunks one event gates), so a scan beats a heap.
type ReadyQueue struct {
	// FIFO takes Works in arrival order, ignoring the rest of their
	// urgency: the order before send-by-deadline, kept for the test that
	// shows the ordering matters.
	FIFO  bool
	items []readyItem
}

type readyItem struct {
	id uint64
	u  Urgency
}

// Push queues id with urgency u.
func (q *ReadyQueue) Push(id uint64, u Urgency) { q.items = append(q.items, readyItem{id, u}) }

// Len is how many ids are queued.
func (q *ReadyQueue) Len() int { return len(q.items) }

// Pop removes and returns the most urgent id; ok is false when the queue is
// empty.
func (q *ReadyQueue) Pop() (id uint64, ok bool) {
	if len(q.items) == 0 {
		return 0, false
	}
	best := 0
	for i := 1; i < len(q.items); i++ {
		a, b := q.items[i].u, q.items[best].u
		if q.FIFO {
			if a.Arrival < b.Arrival {
				best = i
			}
		} else if a.Before(b) {
			best = i
		}
	}
	id = q.items[best].id
	q.items = append(q.items[:best], q.items[best+1:]...)
	return id, true
}
