package cluster

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"
)

// Local is the in-process provider: the same semantics as etcd's within one
// process, with no lease to expire (a member stays until it closes).
type Local struct {
	wg       sync.WaitGroup // watch goroutines: Close waits for them
	mu       sync.Mutex
	closed   bool
	members  map[memberKey]*localReg
	watchers map[*localWatch]struct{}
}

var _ Provider = (*Local)(nil)

type memberKey struct {
	role Role
	id   string
}

// NewLocal returns an empty in-process provider.
func NewLocal() *Local {
	return &Local{members: map[memberKey]*localReg{}, watchers: map[*localWatch]struct{}{}}
}

// localWatch queues events without bound so that a registration never
// waits for a slow watcher; its goroutine hands them out in order.
type localWatch struct {
	role  Role
	mu    sync.Mutex
	queue []Event
	wake  chan struct{} // capacity 1: "the queue grew"
	stop  chan struct{} // closed by the provider's Close
}

func (w *localWatch) push(e Event) {
	w.mu.Lock()
	w.queue = append(w.queue, e)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

type localReg struct {
	p    *Local
	m    Member
	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	err  error
}

func (r *localReg) Member() Member        { return r.m }
func (r *localReg) Done() <-chan struct{} { return r.done }

func (r *localReg) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *localReg) Close() error {
	r.p.remove(r, nil)
	return nil
}

func (r *localReg) end(err error) {
	r.once.Do(func() {
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
		close(r.done)
	})
}

// Register implements Provider.
func (p *Local) Register(_ context.Context, m Member) (Registration, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	k := memberKey{m.Role, m.ID}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.Mark(errors.Newf("register %s %q: provider closed", m.Role, m.ID), ErrClosed)
	}
	if old, ok := p.members[k]; ok {
		return nil, errors.Mark(errors.Newf("register %s %q at %s: the identity is held by %s %q at %s, a live member", m.Role, m.ID, m.Addr, old.m.Role, old.m.ID, old.m.Addr), ErrConflict)
	}
	r := &localReg{p: p, m: m, done: make(chan struct{})}
	p.members[k] = r
	p.notify(Event{Kind: Joined, Member: m})
	return r, nil
}

// remove deletes r if it is still the registered record and ends it.
func (p *Local) remove(r *localReg, err error) {
	p.mu.Lock()
	k := memberKey{r.m.Role, r.m.ID}
	if p.members[k] == r {
		delete(p.members, k)
		p.notify(Event{Kind: Left, Member: r.m})
	}
	p.mu.Unlock()
	r.end(err)
}

// notify runs under p.mu, which orders the events every watcher sees.
func (p *Local) notify(e Event) {
	for w := range p.watchers {
		if w.role == e.Member.Role {
			w.push(e)
		}
	}
}

// Lookup implements Provider.
func (p *Local) Lookup(_ context.Context, role Role, id string) (Member, error) {
	if err := role.Validate(); err != nil {
		return Member{}, err
	}
	if err := ValidateID(id); err != nil {
		return Member{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Member{}, errors.Mark(errors.Newf("lookup %s %q: provider closed", role, id), ErrClosed)
	}
	r, ok := p.members[memberKey{role, id}]
	if !ok {
		return Member{}, errors.Mark(errors.Newf("lookup %s %q: not registered", role, id), ErrNotFound)
	}
	return r.m, nil
}

// List implements Provider.
func (p *Local) List(_ context.Context, role Role) ([]Member, error) {
	if err := role.Validate(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.Mark(errors.Newf("list %s: provider closed", role), ErrClosed)
	}
	return p.listLocked(role), nil
}

func (p *Local) listLocked(role Role) []Member {
	out := []Member{}
	for k, r := range p.members {
		if k.role == role {
			out = append(out, r.m)
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Watch implements Provider.
func (p *Local) Watch(ctx context.Context, role Role) ([]Member, <-chan Event, error) {
	if err := role.Validate(); err != nil {
		return nil, nil, err
	}
	w := &localWatch{role: role, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, nil, errors.Mark(errors.Newf("watch %s: provider closed", role), ErrClosed)
	}
	initial := p.listLocked(role)
	p.watchers[w] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()

	out := make(chan Event)
	go func() {
		defer p.wg.Done()
		defer close(out)
		defer func() {
			p.mu.Lock()
			delete(p.watchers, w)
			p.mu.Unlock()
		}()
		for {
			w.mu.Lock()
			q := w.queue
			w.queue = nil
			w.mu.Unlock()
			for _, e := range q {
				select {
				case out <- e:
				case <-ctx.Done():
					return
				case <-w.stop:
					return
				}
			}
			select {
			case <-w.wake:
			case <-ctx.Done():
				return
			case <-w.stop:
				return
			}
		}
	}()
	return initial, out, nil
}

// Close implements Provider: every member leaves (watchers are told) and
// every watch ends.
func (p *Local) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	regs := make([]*localReg, 0, len(p.members))
	for k, r := range p.members {
		regs = append(regs, r)
		delete(p.members, k)
		p.notify(Event{Kind: Left, Member: r.m})
	}
	for w := range p.watchers {
		close(w.stop)
	}
	p.watchers = map[*localWatch]struct{}{}
	p.mu.Unlock()
	for _, r := range regs {
		r.end(nil)
	}
	p.wg.Wait()
	return nil
}
