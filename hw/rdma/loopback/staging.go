package loopback

import (
	"math/bits"
	"sync"
)

// Staging buffers are reused: fresh memory costs a page fault per page on
// first touch, which dwarfs the copy itself (hundreds of ms per GB in a VM).
// A plain free list, not a sync.Pool: a pool is emptied by the collector,
// and the scavenger would hand the pages back to the OS.
var stages struct {
	sync.Mutex
	free [40][][]byte // by power-of-two capacity
}

const stagesPerClass = 8

// Prewarm makes count staging buffers for batches of up to n bytes ready,
// their pages touched, so that the first batches of a benchmark do not pay
// the first-touch faults (on a VM, up to a few hundred ms per 32 MB).
func Prewarm(n uint64, count int) {
	bufs := make([][]byte, 0, count)
	for i := 0; i < count; i++ {
		b := getStage(n)
		b = b[:cap(b)]
		for j := 0; j < len(b); j += 4096 {
			b[j] = 0
		}
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		putStage(b)
	}
}

func getStage(n uint64) []byte {
	c := 0
	if n > 1 {
		c = bits.Len64(n - 1)
	}
	stages.Lock()
	defer stages.Unlock()
	if l := len(stages.free[c]); l > 0 {
		b := stages.free[c][l-1]
		stages.free[c] = stages.free[c][:l-1]
		return b[:0]
	}
	return make([]byte, 0, 1<<c)
}

func putStage(b []byte) {
	if cap(b) == 0 || cap(b)&(cap(b)-1) != 0 {
		return
	}
	c := bits.Len64(uint64(cap(b)) - 1)
	stages.Lock()
	defer stages.Unlock()
	if len(stages.free[c]) < stagesPerClass {
		stages.free[c] = append(stages.free[c], b[:0])
	}
}
