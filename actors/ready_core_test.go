package actors

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
