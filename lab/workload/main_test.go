package workload

import (
	"testing"

	"go.uber.org/goleak"
)

// A run's goroutines (the engines', the rig's, the stall probe's) end
// with it. protoactor's dead-letter throttle ends one second after its
// last message on its own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"))
}
