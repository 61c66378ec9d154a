package stacks

import (
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parkOnMutex blocks on mu until it is unlocked; its name marks its frame.
//
//go:noinline
func parkOnMutex(mu *sync.Mutex, done chan<- struct{}) {
	mu.Lock()
	mu.Unlock() //nolint:staticcheck // only the wait matters
	close(done)
}

// A goroutine parked on a mutex is found by its frame, in that state,
// with that frame its innermost outside the runtime; once it returned it
// is found no more.
func TestBlockedSeesAParkedGoroutine(t *testing.T) {
	var mu sync.Mutex
	mu.Lock()
	done := make(chan struct{})
	go parkOnMutex(&mu, done)
	for !Blocked("stacks.parkOnMutex", func(g Goroutine) bool { return g.State == "sync.Mutex.Lock" }) {
		runtime.Gosched() // polled: the goroutine parks when the scheduler runs it
	}
	var found Goroutine
	for _, g := range All() {
		if strings.Contains(g.Text, "stacks.parkOnMutex") {
			found = g
		}
	}
	require.True(t, found.Parked())
	assert.Contains(t, found.Innermost(), "Mutex", "it waits in the mutex, past the runtime's frames")
	assert.NotContains(t, found.Innermost(), "runtime")
	assert.False(t, Blocked("stacks.parkOnMutex", func(g Goroutine) bool { return g.State == "chan receive" }), "in another state")
	mu.Unlock()
	<-done
	assert.False(t, Blocked("stacks.parkOnMutex", nil), "it returned")
}
