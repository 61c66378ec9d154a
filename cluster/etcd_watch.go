package cluster

import (
	"context"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Watch implements Provider. A watch on an unreachable etcd fails at once
// (ErrUnavailable) since its listing does. Afterwards the
// watch survives etcd restarts (the client resumes from the last revision
// seen); when it cannot resume (the revision was compacted away, or the
// etcd member it is attached to lost its leader), it lists the role again,
// retrying until etcd answers, and reports the difference, so the caller's
// view stays exact either way.
func (p *Etcd) Watch(ctx context.Context, role Role) ([]Member, <-chan Event, error) {
	if err := role.Validate(); err != nil {
		return nil, nil, err
	}
	if err := p.checkOpen("watch %s", role); err != nil {
		return nil, nil, err
	}
	initial, rev, err := p.list(ctx, role)
	if err != nil {
		return nil, nil, errors.Wrap(err, "watch")
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, nil, errors.Mark(errors.Newf("watch %s: provider closed", role), ErrClosed)
	}
	p.wg.Add(1)
	p.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(p.ctx, cancel)
	out := make(chan Event)
	w := &etcdWatch{p: p, role: role, out: out, ctx: wctx, known: make(map[string]Member, len(initial))}
	for _, m := range initial {
		w.known[m.ID] = m
	}
	go func() {
		defer p.wg.Done()
		defer close(out)
		defer stop()
		defer cancel()
		w.run(rev)
	}()
	return initial, out, nil
}

type etcdWatch struct {
	p     *Etcd
	role  Role
	out   chan<- Event
	ctx   context.Context
	known map[string]Member // by id: the view the caller has been told
}

func (w *etcdWatch) emit(kind EventKind, m Member) bool {
	select {
	case w.out <- Event{Kind: kind, Member: m}:
		return true
	case <-w.ctx.Done():
		return false
	}
}

// sync reports the difference between the known view and a listing.
func (w *etcdWatch) sync(ms []Member) bool {
	seen := make(map[string]bool, len(ms))
	for _, m := range ms {
		seen[m.ID] = true
	}
	for id, old := range w.known {
		if !seen[id] {
			delete(w.known, id)
			if !w.emit(Left, old) {
				return false
			}
		}
	}
	for _, m := range ms {
		if old, ok := w.known[m.ID]; ok && old == m {
			continue
		}
		w.known[m.ID] = m
		if !w.emit(Joined, m) {
			return false
		}
	}
	return true
}

func (w *etcdWatch) run(rev int64) {
	log := w.p.log.With(zap.String("role", string(w.role)))
	prefix := w.p.rolePrefix(w.role)
	// again paces watches that fail as soon as they open (one etcd member
	// without a leader behind a client whose listings reach another).
	again := 100 * time.Millisecond
	for {
		opened := time.Now()
		// A context per attempt: breaking out of the loop below must end
		// the client's watch stream too, or each resync would leave one.
		// WithRequireLeader: an etcd member cut off from its leader
		// delivers no events and no error on its own, so without it the
		// view would go stale for the partition's length; with it the
		// stream fails ("no leader") and the listing below retries until
		// a member with a leader answers.
		actx, acancel := context.WithCancel(w.ctx)
		wch := w.p.cli.Watch(clientv3.WithRequireLeader(actx), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithPrevKV())
		ok := w.consume(wch, prefix, &rev, log)
		acancel()
		if !ok || w.ctx.Err() != nil {
			return
		}
		if time.Since(opened) < time.Second {
			select {
			case <-w.ctx.Done():
				return
			case <-time.After(again):
			}
			again = min(2*again, 2*time.Second)
		} else {
			again = 100 * time.Millisecond
		}
		// The channel closed without our cancel (or reported an error):
		// list again until etcd answers, then carry on from there.
		backoff := 100 * time.Millisecond
		failures := 0
		for {
			ms, r, err := w.p.list(w.ctx, w.role)
			if err == nil {
				if !w.sync(ms) {
					return
				}
				rev = r
				break
			}
			if w.ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 {
				log.Warn("cluster: listing for a watch failed; retrying until etcd answers", warnErr(err))
			}
			select {
			case <-w.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// consume applies a watch's events to the known view and reports them,
// until the channel ends or reports an error; false means the caller's
// context ended while reporting.
func (w *etcdWatch) consume(wch clientv3.WatchChan, prefix string, rev *int64, log *zap.Logger) bool {
	for wr := range wch {
		if err := wr.Err(); err != nil {
			if w.ctx.Err() == nil {
				log.Warn("cluster: watch interrupted; listing again", warnErr(err))
			}
			break
		}
		for _, ev := range wr.Events {
			id := strings.TrimPrefix(string(ev.Kv.Key), prefix)
			switch ev.Type {
			case clientv3.EventTypePut:
				m, named, err := w.p.decode(string(ev.Kv.Key), ev.Kv.Value)
				if err == nil {
					err = w.earned(ev.Kv.Lease, named)
				}
				if err != nil {
					// A record that no longer parses, or that no live
					// lease holds, is no longer a member a caller can
					// use.
					w.p.ignored(string(ev.Kv.Key), ev.Kv.ModRevision, err.Error())
					if old, ok := w.known[id]; ok {
						delete(w.known, id)
						if !w.emit(Left, old) {
							return false
						}
					}
					continue
				}
				if old, ok := w.known[id]; ok && old == m {
					continue
				}
				w.known[id] = m
				if !w.emit(Joined, m) {
					return false
				}
			case clientv3.EventTypeDelete:
				old, ok := w.known[id]
				if !ok {
					continue
				}
				delete(w.known, id)
				if !w.emit(Left, old) {
					return false
				}
			}
		}
		*rev = wr.Header.Revision
	}
	return true
}

// earned checks that a record just put is attached to the lease it names
// and that the lease is alive (one call per put: members change rarely).
func (w *etcdWatch) earned(lease, named int64) error {
	if lease == 0 || named != lease {
		return errors.New(unearned(lease, named, nil))
	}
	ctx, cancel := w.p.opCtx(w.ctx)
	defer cancel()
	live, err := w.p.liveLeases(ctx, []int64{lease})
	if err != nil {
		// etcd just delivered the put: a failure to check now is
		// transient, and a record with a lease is taken as it is (the
		// next listing checks it again).
		return nil
	}
	if why := unearned(lease, named, live); why != "" {
		return errors.New(why)
	}
	return nil
}
