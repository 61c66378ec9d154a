package cluster

import (
	"context"
	"sync"

	"github.com/cockroachdb/errors"
)

// Resolver answers lookups from memory: a session resolves its peers once
// (the first Resolve of an identity asks the provider) and every later
// Resolve is a map read that allocates nothing, so a per-forward path that
// needs a peer's record never waits on etcd.
//
// With Follow, the cache tracks a role's watch: a member that leaves is
// evicted (the next Resolve asks again, and fails with ErrNotFound until it
// rejoins) and a member that rejoins with a new address replaces its entry.
// Without it, Forget evicts an entry whose peer the caller saw go away.
type Resolver struct {
	p Provider

	mu    sync.RWMutex
	cache map[memberKey]Member
	epoch uint64 // bumped by every eviction: a lookup that raced one is not cached

	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// NewResolver returns an empty cache in front of p.
func NewResolver(p Provider) *Resolver {
	ctx, cancel := context.WithCancel(context.Background())
	return &Resolver{p: p, cache: map[memberKey]Member{}, ctx: ctx, cancel: cancel}
}

// Resolve returns the member registered as (role, id), from the cache when
// it is there.
func (r *Resolver) Resolve(ctx context.Context, role Role, id string) (Member, error) {
	r.mu.RLock()
	m, ok := r.cache[memberKey{role, id}]
	epoch := r.epoch
	r.mu.RUnlock()
	if ok {
		return m, nil
	}
	m, err := r.p.Lookup(ctx, role, id)
	if err != nil {
		return Member{}, err
	}
	r.mu.Lock()
	if r.epoch == epoch {
		r.cache[memberKey{role, id}] = m
	}
	r.mu.Unlock()
	return m, nil
}

// Forget evicts (role, id): the next Resolve asks the provider.
func (r *Resolver) Forget(role Role, id string) {
	r.mu.Lock()
	delete(r.cache, memberKey{role, id})
	r.epoch++
	r.mu.Unlock()
}

// Follow keeps the cache's entries of role current from a watch until the
// resolver closes: every member the watch reports is cached (the watch
// starts with the current members, so the cache warms up without a lookup
// per identity), a Left evicts, and a rejoin with a new address replaces
// the entry. It fails as Watch does (ErrUnavailable when etcd is down).
func (r *Resolver) Follow(role Role) error {
	events, err := r.p.Watch(r.ctx, role)
	if err != nil {
		return errors.Wrapf(err, "resolver: follow %s", role)
	}
	r.wg.Go(func() {
		for e := range events {
			k := memberKey{e.Member.Role, e.Member.ID}
			r.mu.Lock()
			switch e.Kind {
			case Joined:
				r.cache[k] = e.Member
			case Left:
				delete(r.cache, k)
			}
			// A Resolve whose lookup raced this event must not store
			// what it read.
			r.epoch++
			r.mu.Unlock()
		}
	})
	return nil
}

// Close stops following; cached entries stay readable.
func (r *Resolver) Close() {
	r.cancel()
	r.wg.Wait()
}
