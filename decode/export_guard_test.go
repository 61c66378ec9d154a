package decode

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// RequestForTest sends msg from node to the actor id on the node at addr
// and waits for the answer within ctx and limit, as the node's own
// requests do: a test's way to name an actor that no Client would.
func RequestForTest(ctx context.Context, node *Node, addr, id string, msg any, limit time.Duration) (any, error) {
	return node.request(ctx, actor.NewPID(addr, id), msg, limit)
}
