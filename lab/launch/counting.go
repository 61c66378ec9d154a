package launch

import (
	"context"
	"sync/atomic"

	"github.com/kvstream/kvstream/cluster"
)

// countingProvider counts the calls that reach the membership provider:
// the evidence that the per-request and per-forward paths make none.
type countingProvider struct {
	cluster.Provider
	calls atomic.Int64
}

func (c *countingProvider) Lookup(ctx context.Context, role cluster.Role, id string) (cluster.Member, error) {
	c.calls.Add(1)
	return c.Provider.Lookup(ctx, role, id)
}

func (c *countingProvider) List(ctx context.Context, role cluster.Role) ([]cluster.Member, error) {
	c.calls.Add(1)
	return c.Provider.List(ctx, role)
}

func (c *countingProvider) Watch(ctx context.Context, role cluster.Role) ([]cluster.Member, <-chan cluster.Event, error) {
	c.calls.Add(1)
	return c.Provider.Watch(ctx, role)
}
