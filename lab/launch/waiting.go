package launch

import (
	"fmt"
	"time"
)

// Waits: a node that has waited waitSay for something says so, then
// every waitEvery while the wait lasts.
const (
	waitSay   = time.Second
	waitEvery = 5 * time.Second
)

// saying runs f, and while it has not returned after waitSay, emits a
// "waiting" event naming what (with the time waited) every waitEvery:
// a node never waits silently.
func saying[T any](out *Emitter, id, what string, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	start := time.Now()
	t := time.NewTimer(waitSay)
	defer t.Stop()
	for {
		select {
		case r := <-done:
			return r.v, r.err
		case <-t.C:
			out.Emit(Event{Event: EventWaiting, ID: id, What: fmt.Sprintf("%s (%.0f s so far)", what, time.Since(start).Seconds())})
			t.Reset(waitEvery)
		}
	}
}
