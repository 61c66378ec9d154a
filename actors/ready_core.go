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
// submitter shell waits, queues and posts). It is a binary heap: one event
// can make the Works of every chunk of a forward ready at once (1 024 rooms:
// 1 024 Works), and a scan per Pop made taking them all quadratic.
type ReadyQueue struct {
	// FIFO takes Works in arrival order, ignoring the rest of their
	// urgency: the order before send-by-deadline, kept for the test that
	// shows the ordering matters.
	FIFO  bool
	items []readyItem // a heap: items[0] goes first
}

type readyItem struct {
	id uint64
	u  Urgency
}

// before orders the heap. Arrivals are unique, so the order is total and
// Pop's sequence depends on nothing but what was pushed.
func (q *ReadyQueue) before(i, j int) bool {
	a, b := q.items[i].u, q.items[j].u
	if q.FIFO {
		return a.Arrival < b.Arrival
	}
	return a.Before(b)
}

// Push queues id with urgency u.
func (q *ReadyQueue) Push(id uint64, u Urgency) {
	q.items = append(q.items, readyItem{id, u})
	for i := len(q.items) - 1; i > 0; {
		parent := (i - 1) / 2
		if !q.before(i, parent) {
			break
		}
		q.items[i], q.items[parent] = q.items[parent], q.items[i]
		i = parent
	}
}

// Len is how many ids are queued.
func (q *ReadyQueue) Len() int { return len(q.items) }

// Pop removes and returns the most urgent id; ok is false when the queue is
// empty.
func (q *ReadyQueue) Pop() (id uint64, ok bool) {
	n := len(q.items)
	if n == 0 {
		return 0, false
	}
	id = q.items[0].id
	n--
	q.items[0] = q.items[n]
	q.items = q.items[:n]
	for i := 0; ; {
		first, l, r := i, 2*i+1, 2*i+2
		if l < n && q.before(l, first) {
			first = l
		}
		if r < n && q.before(r, first) {
			first = r
		}
		if first == i {
			break
		}
		q.items[i], q.items[first] = q.items[first], q.items[i]
		i = first
	}
	return id, true
}
