package actors

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"pgregory.net/rapid"
)

// The most urgent first: a request's last chunk, then registration order,
// then arrival; FIFO keeps arrival order alone.
func TestReadyQueueOrder(t *testing.T) {
	push := func(q *ReadyQueue) {
		q.Push(1, Urgency{Serial: 1, Arrival: 1})             // an earlier request's middle chunk
		q.Push(2, Urgency{Last: true, Serial: 2, Arrival: 2}) // a request's last chunk
		q.Push(3, Urgency{Serial: 1, Arrival: 3})             // the same chunk's second destination
		q.Push(4, Urgency{Last: true, Serial: 3, Arrival: 0}) // another last chunk, registered later
	}
	pop := func(q *ReadyQueue) []uint64 {
		var out []uint64
		for {
			id, ok := q.Pop()
			if !ok {
				return out
			}
			out = append(out, id)
		}
	}
	var q ReadyQueue
	push(&q)
	assert.Equal(t, 4, q.Len())
	assert.Equal(t, []uint64{2, 4, 1, 3}, pop(&q))
	fifo := ReadyQueue{FIFO: true}
	push(&fifo)
	assert.Equal(t, []uint64{4, 1, 2, 3}, pop(&fifo))
}

// The heap gives what a scan for the most urgent gives, whatever the pushes
// and pops interleaved (the scan is the model: it is what the queue was).
func TestReadyQueueIsTheScanOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		q := ReadyQueue{FIFO: rapid.Bool().Draw(t, "fifo")}
		var model []readyItem
		arrival := uint64(0)
		for step := range rapid.IntRange(0, 200).Draw(t, "steps") {
			if rapid.IntRange(0, 2).Draw(t, "op") > 0 {
				arrival++
				u := Urgency{Last: rapid.Bool().Draw(t, "last"), Serial: rapid.Uint64Range(0, 8).Draw(t, "serial"), Arrival: arrival}
				q.Push(uint64(step), u)
				model = append(model, readyItem{uint64(step), u})
				continue
			}
			id, ok := q.Pop()
			if len(model) == 0 {
				if ok {
					t.Fatalf("popped %d from an empty queue", id)
				}
				continue
			}
			best := 0
			for i := range model {
				if (q.FIFO && model[i].u.Arrival < model[best].u.Arrival) || (!q.FIFO && model[i].u.Before(model[best].u)) {
					best = i
				}
			}
			if !ok || id != model[best].id {
				t.Fatalf("popped %d (ok %v), the scan gives %d", id, ok, model[best].id)
			}
			model = append(model[:best], model[best+1:]...)
			if q.Len() != len(model) {
				t.Fatalf("len %d, want %d", q.Len(), len(model))
			}
		}
	})
}
