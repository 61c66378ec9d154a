package cluster

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"
)

// Resolver answers lookups from memory: a session resolves its peers once
// (the first Resolve of an identity asks the provider) and every later
// Resolve is a map read that allocates nothing, so a per-forward path that
// needs a peer's record never waits on etcd.
//
// With Follow, the resolver tracks a role's watch: every member of the role
// is cached, a member that leaves is evicted (Resolve then asks the
// provider again, and fails with ErrNotFound until it rejoins), a rejoin
// with a new address replaces its entry, and Pick chooses among the live
// members without asking anyone. Without Follow, Forget evicts an entry
// whose peer the caller saw go away.
type Resolver struct {
	p Provider

	mu       sync.RWMutex
	cache    map[memberKey]Member
	epoch    uint64 // bumped by every change the watch makes: a lookup that raced one is not cached
	followed map[Role]*atomic.Pointer[[]Member]

	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// NewResolver returns an empty cache in front of p.
func NewResolver(p Provider) *Resolver {
	ctx, cancel := context.WithCancel(context.Background())
	return &Resolver{
		p:        p,
		cache:    map[memberKey]Member{},
		followed: map[Role]*atomic.Pointer[[]Member]{},
		ctx:      ctx,
		cancel:   cancel,
	}
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

// Follow caches every member of role and keeps them current from a watch
// until the resolver closes. It returns once the current members are
// cached; it fails as Watch does (ErrUnavailable when etcd is down).
// Following a role twice is a no-op.
func (r *Resolver) Follow(role Role) error {
	r.mu.Lock()
	_, ok := r.followed[role]
	r.mu.Unlock()
	if ok {
		return nil
	}
	initial, events, err := r.p.Watch(r.ctx, role)
	if err != nil {
		return errors.Wrapf(err, "resolver: follow %s", role)
	}
	view := &atomic.Pointer[[]Member]{}
	r.mu.Lock()
	if _, ok := r.followed[role]; ok {
		// A concurrent Follow won; this watch ends with the resolver.
		r.mu.Unlock()
		r.wg.Go(func() {
			for range events {
			}
		})
		return nil
	}
	r.followed[role] = view
	for _, m := range initial {
		r.cache[memberKey{role, m.ID}] = m
	}
	r.epoch++
	r.publishLocked(role, view)
	r.mu.Unlock()
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
			r.epoch++
			r.publishLocked(role, view)
			r.mu.Unlock()
		}
	})
	return nil
}

// publishLocked stores the sorted members of a followed role for Pick.
// Membership changes are rare; Pick runs per request.
func (r *Resolver) publishLocked(role Role, view *atomic.Pointer[[]Member]) {
	var ms []Member
	for k, m := range r.cache {
		if k.role == role {
			ms = append(ms, m)
		}
	}
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	view.Store(&ms)
}

// Members returns the live members of a followed role, sorted by id. The
// slice is shared: do not modify it.
func (r *Resolver) Members(role Role) ([]Member, error) {
	r.mu.RLock()
	view := r.followed[role]
	r.mu.RUnlock()
	if view == nil {
		return nil, errors.Mark(errors.Newf("resolver: role %q is not followed", string(role)), ErrInvalid)
	}
	return *view.Load(), nil
}

// Pick chooses a live member of a followed role from memory: the member at
// key modulo their number, in id order. A scheduler passes a request
// counter (round robin) or a hash of the request. It fails with
// ErrNotFound when the role has no live member.
func (r *Resolver) Pick(role Role, key uint64) (Member, error) {
	ms, err := r.Members(role)
	if err != nil {
		return Member{}, err
	}
	if len(ms) == 0 {
		return Member{}, errors.Mark(errors.Newf("resolver: no live %s member", role), ErrNotFound)
	}
	return ms[key%uint64(len(ms))], nil
}

// Close stops following; cached entries stay readable.
func (r *Resolver) Close() {
	r.cancel()
	r.wg.Wait()
}
