package tests

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaks, except protoactor's dead-letter throttle (as
// package decode's tests do): a goroutine that a dead letter starts when
// both ends of a decode session stop, and that ends one throttle interval
// (1 s) later, on its own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"))
}
