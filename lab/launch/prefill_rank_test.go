package launch

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestRankGoodbyesStopWithTheRank: goodbyes spawned (by OnDrain, on the
// node's goroutines) while the rank stops either run before closeByes
// returns or not at all, and none starts after it (run under -race: a
// WaitGroup Add racing its Wait is reported).
func TestRankGoodbyesStopWithTheRank(t *testing.T) {
	k := &rank{}
	var ran, after atomic.Int64
	var closed atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				k.spawnBye(func() {
					ran.Add(1)
					if closed.Load() {
						after.Add(1)
					}
				})
			}
		})
	}
	k.closeByes()
	closed.Store(true)
	wg.Wait()
	k.spawnBye(func() { after.Add(1) })
	k.byes.Wait() // a goodbye started despite closeByes would be counted
	assert.Zero(t, after.Load(), "a goodbye ran after closeByes returned")
	t.Logf("%d goodbyes ran before the rank stopped", ran.Load())
}
