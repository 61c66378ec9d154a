package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdReg holds one member's key: a keep-alive goroutine renews its lease,
// puts the member's record back when someone else rewrote or deleted it
// (and ends the registration if another live member took the key), and
// rejoins under a new lease when the old one was lost (etcd unreachable
// for longer than the TTL, or the lease revoked by someone else).
type etcdReg struct {
	p      *Etcd
	m      Member
	key    string
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	exited chan struct{} // the keep-alive goroutine returned

	closeOnce sync.Once
	closeErr  error
	endOnce   sync.Once
	done      chan struct{}

	mu    sync.Mutex
	err   error
	lease clientv3.LeaseID
}

func (r *etcdReg) Member() Member        { return r.m }
func (r *etcdReg) Done() <-chan struct{} { return r.done }

func (r *etcdReg) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *etcdReg) end(err error) {
	r.endOnce.Do(func() {
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
		close(r.done)
	})
}

// Register implements Provider. When another live lease holds the identity
// (a process restarted before its predecessor's lease expired), Register
// waits for that lease to run out, bounded by ctx; if the holder is still
// there after its TTL it is alive, and Register fails with ErrConflict
// naming it.
func (p *Etcd) Register(ctx context.Context, m Member) (Registration, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if err := p.checkOpen("register %s %q", m.Role, m.ID); err != nil {
		return nil, err
	}
	r := &etcdReg{p: p, m: m, key: p.key(m.Role, m.ID), exited: make(chan struct{}), done: make(chan struct{})}
	lease, err := p.acquire(ctx, r)
	if err != nil {
		return nil, err
	}
	r.lease = lease
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = p.revoke(lease)
		return nil, errors.Mark(errors.Newf("register %s %q: provider closed", m.Role, m.ID), ErrClosed)
	}
	r.ctx, r.cancel = context.WithCancel(p.ctx)
	p.regs[r] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	go r.keep(lease)
	return r, nil
}

// acquire grants a lease and creates the member's key under it, if the key
// is free; see Register for a key held by another lease.
func (p *Etcd) acquire(ctx context.Context, r *etcdReg) (clientv3.LeaseID, error) {
	var deadline time.Time
	var conflict error // the last conflict seen, if any
	for {
		lease, h, err := p.tryCreate(ctx, r)
		if err == nil {
			return lease, nil
		}
		if h == nil {
			if conflict != nil && ctx.Err() != nil {
				// The caller's time ran out while it waited for the
				// holder: that is what it needs to hear.
				return 0, errors.Wrapf(conflict, "gave up waiting for the holder's lease to expire (%v)", ctx.Err())
			}
			return 0, err
		}
		conflict = err
		if deadline.IsZero() {
			// etcd reports whole seconds, and revokes expired leases in
			// a periodic sweep through raft: allow a second for each.
			left := p.holderTTL(ctx, h.lease)
			deadline = time.Now().Add(left + 2*time.Second)
			if h.lease != 0 {
				// Said once: a restart commonly finds its predecessor's
				// lease still there.
				p.log.Warn("cluster: waiting for the holder's lease to expire before registering",
					zap.String("role", string(r.m.Role)), zap.String("id", r.m.ID), zap.Duration("up_to", left+2*time.Second), zap.String("holder", err.Error()))
			}
		}
		if time.Now().After(deadline) {
			return 0, err
		}
		poll := min(p.cfg.TTL/10+50*time.Millisecond, time.Second)
		select {
		case <-ctx.Done():
			return 0, errors.Wrapf(err, "gave up waiting for the holder's lease to expire (%v)", ctx.Err())
		case <-time.After(poll):
		}
	}
}

// tryCreate makes one attempt; when the key is taken by a live member it
// returns the holder's record with an error marked ErrConflict that names
// both. A record that no live lease holds (written without a lease, or
// left by a lease that is gone) is not a member's: it is replaced, and
// logged.
func (p *Etcd) tryCreate(ctx context.Context, r *etcdReg) (clientv3.LeaseID, *holder, error) {
	octx, cancel := p.opCtx(ctx)
	defer cancel()
	g, err := p.cli.Grant(octx, p.ttlSec)
	if err != nil {
		return 0, nil, p.callErr(ctx, err, "register %s %q: grant a lease", r.m.Role, r.m.ID)
	}
	val := value(r.m, g.ID)
	resp, err := p.cli.Txn(octx).
		If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)).
		Then(clientv3.OpPut(r.key, val, clientv3.WithLease(g.ID))).
		Else(clientv3.OpGet(r.key)).
		Commit()
	if err == nil && resp.Succeeded {
		return g.ID, nil, nil
	}
	if err != nil {
		_ = p.revoke(g.ID)
		return 0, nil, p.callErr(ctx, err, "register %s %q", r.m.Role, r.m.ID)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		// Deleted between the compare and the get: retry at once.
		_ = p.revoke(g.ID)
		return 0, &holder{}, errors.Mark(errors.Newf("register %s %q: key changed during registration", r.m.Role, r.m.ID), ErrConflict)
	}
	kv := kvs[0]
	held := fmt.Sprintf("a record without a parsable member (revision %d)", kv.ModRevision)
	m, named, derr := p.decode(r.key, kv.Value)
	if derr == nil {
		held = fmt.Sprintf("%s %q at %s", m.Role, m.ID, m.Addr)
	}
	live, lerr := p.liveLeases(octx, []int64{kv.Lease})
	if lerr == nil {
		// A record that does not parse names no lease: no member's.
		if why := unearned(kv.Lease, named, live); why != "" {
			// Not a member: take the key over, if it is still that
			// record.
			p.ignored(r.key, kv.ModRevision, why)
			tr, terr := p.cli.Txn(octx).
				If(clientv3.Compare(clientv3.ModRevision(r.key), "=", kv.ModRevision)).
				Then(clientv3.OpPut(r.key, val, clientv3.WithLease(g.ID))).
				Commit()
			if terr == nil && tr.Succeeded {
				p.log.Warn("cluster: registered over a record that was not a member's",
					zap.String("key", r.key), zap.String("replaced", held), zap.String("why", why), zap.String("addr", r.m.Addr))
				return g.ID, nil, nil
			}
			_ = p.revoke(g.ID)
			if terr != nil {
				return 0, nil, p.callErr(ctx, terr, "register %s %q", r.m.Role, r.m.ID)
			}
			return 0, &holder{}, errors.Mark(errors.Newf("register %s %q: key changed during registration", r.m.Role, r.m.ID), ErrConflict)
		}
	}
	// The lease holds nothing: do not leave it to its TTL.
	_ = p.revoke(g.ID)
	return 0, &holder{lease: clientv3.LeaseID(kv.Lease)}, errors.Mark(errors.Newf("register %s %q at %s: the identity is held by %s, a live member (lease %x)",
		r.m.Role, r.m.ID, r.m.Addr, held, kv.Lease), ErrConflict)
}

// holder is the part of a conflicting record acquire needs.
type holder struct{ lease clientv3.LeaseID }

// holderTTL is how long the holder's lease has left (the configured TTL
// if etcd cannot say).
func (p *Etcd) holderTTL(ctx context.Context, lease clientv3.LeaseID) time.Duration {
	if lease == 0 {
		return 0
	}
	octx, cancel := p.opCtx(ctx)
	defer cancel()
	resp, err := p.cli.TimeToLive(octx, lease)
	if err != nil {
		return p.cfg.TTL
	}
	if resp.TTL < 0 {
		return 0
	}
	return time.Duration(resp.TTL) * time.Second
}

// revoke drops a lease now, bounded by OpTimeout; etcd's TTL is the
// fallback when it cannot be reached.
func (p *Etcd) revoke(lease clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.OpTimeout)
	defer cancel()
	_, err := p.cli.Revoke(ctx, lease)
	if err != nil && !isLeaseGone(err) {
		return p.callErr(ctx, err, "revoke lease %x", int64(lease))
	}
	return nil
}

// isLeaseGone: revoking a lease that already expired is not a failure.
func isLeaseGone(err error) bool { return errors.Is(err, rpctypes.ErrLeaseNotFound) }

// keep renews the lease until Close, and at every keep-alive answer (every
// TTL/3) puts the member's record back if someone else rewrote or deleted
// it, or ends the registration (ErrConflict) if another live member took
// the key meanwhile (see reassert). When the keep-alive ends without a
// Close, etcd expired the lease or did not answer for a whole TTL; keep
// then renews the same lease if it still exists (etcd restarted within the
// TTL and renewed it: nobody saw the member leave), and registers the
// member under a new lease otherwise.
func (r *etcdReg) keep(lease clientv3.LeaseID) {
	defer r.p.wg.Done()
	defer close(r.exited)
	log := r.p.log.With(zap.String("role", string(r.m.Role)), zap.String("id", r.m.ID))
	backoff := 100 * time.Millisecond
	for {
		// A context per keep-alive: ending the registration from inside
		// the loop below must stop the client's renewals too.
		kctx, kcancel := context.WithCancel(r.ctx)
		ch, err := r.p.cli.KeepAlive(kctx, lease)
		if err == nil {
			for range ch {
				if cerr := r.reassert(log, lease); cerr != nil {
					kcancel()
					log.Warn("cluster: registration ended: identity taken by another live member", warnErr(cerr))
					// The lease holds nothing: do not leave it to its TTL.
					if rerr := r.p.revoke(lease); rerr != nil {
						log.Debug("cluster: revoking the lease of an ended registration failed", zap.Int64("lease", int64(lease)), zap.Error(rerr))
					}
					r.end(cerr)
					return
				}
			}
		}
		kcancel()
		if r.ctx.Err() != nil {
			return
		}
		// Expected on a loaded host or while etcd restarts: said at DEBUG
		// unless the member actually left (its lease expired) or etcd
		// stays away.
		log.Debug("cluster: keep-alive ended; renewing or registering again", zap.Int64("lease", int64(lease)), zap.Error(err))
		failures := 0
		for {
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, max(r.p.cfg.TTL/2, 200*time.Millisecond))
			var alive bool
			alive, err = r.p.renewOnce(r.ctx, lease)
			if alive {
				log.Debug("cluster: lease renewed", zap.Int64("lease", int64(lease)))
				break
			}
			if err == nil {
				var fresh clientv3.LeaseID
				fresh, err = r.p.acquire(r.ctx, r)
				if err == nil {
					lease = fresh
					r.mu.Lock()
					r.lease = lease
					r.mu.Unlock()
					// Watchers saw the member leave and come back.
					log.Warn("cluster: the lease expired (no keep-alive answered within the TTL): registered again",
						zap.Int64("lease", int64(lease)), zap.Duration("ttl", r.p.cfg.TTL))
					break
				}
			}
			if r.ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrConflict) {
				log.Warn("cluster: registration ended: identity taken while the lease was lost", warnErr(err))
				r.end(err)
				return
			}
			// One WARN per outage; the retries are DEBUG.
			failures++
			if failures == 1 {
				log.Warn("cluster: registering again failed; retrying until etcd answers", warnErr(err))
			} else {
				log.Debug("cluster: registering again failed", zap.Int("attempt", failures), zap.Error(err))
			}
		}
		backoff = 100 * time.Millisecond
	}
}

// reassert puts the member's record back under its own lease when the key
// no longer holds exactly that and no other live member holds it: when it
// was deleted, rewritten under this registration's lease, or rewritten in
// a record that is not a member's (no lease, a lease that is gone, or a
// lease other than the one the record names; see unearned). etcd detaches
// a key from its lease when it is overwritten, so the lease lives on while
// readers, rightly, no longer take the record as a member's, and nothing
// else would ever write it again. A record that another live member wrote
// under its own lease is left alone: the identity went to another process
// (an operator deleted this member's key to let a restarted process in),
// and putting it back would have the two overwrite each other at every
// keep-alive. reassert then returns an error marked ErrConflict that names
// the holder, and the registration ends with it. A record that is intact
// costs one transaction; a put is made only if the key is still what was
// read, so a member that registers meanwhile is not overwritten. A put
// under a lease that just expired fails; the keep-alive's end then
// registers the member again. Failures to reach etcd are left to the next
// keep-alive.
func (r *etcdReg) reassert(log *zap.Logger, lease clientv3.LeaseID) error {
	val := value(r.m, lease)
	ctx, cancel := r.p.opCtx(r.ctx)
	defer cancel()
	resp, err := r.p.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(r.key), "=", val), clientv3.Compare(clientv3.LeaseValue(r.key), "=", lease)).
		Else(clientv3.OpGet(r.key)).
		Commit()
	if err != nil {
		// etcd away or the lease just lost: the keep-alive says so.
		if r.ctx.Err() == nil {
			log.Debug("cluster: checking the member's record failed", zap.Int64("lease", int64(lease)), zap.Error(err))
		}
		return nil
	}
	if resp.Succeeded {
		return nil
	}
	var (
		found string
		cmp   clientv3.Cmp // the key is still what was found
	)
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		found = "no record (deleted)"
		cmp = clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)
	} else {
		kv := kvs[0]
		v := kv.Value
		if len(v) > 256 {
			v = v[:256]
		}
		found = fmt.Sprintf("%q under lease %x", v, kv.Lease)
		cmp = clientv3.Compare(clientv3.ModRevision(r.key), "=", kv.ModRevision)
		if kv.Lease != int64(lease) {
			m, named, derr := r.p.decode(r.key, kv.Value)
			live, lerr := r.p.liveLeases(ctx, []int64{kv.Lease})
			if lerr != nil {
				if r.ctx.Err() == nil {
					log.Debug("cluster: checking the lease of the member's record failed", zap.Int64("lease", int64(lease)), zap.Error(lerr))
				}
				return nil
			}
			// A record that does not parse names no lease: no member's.
			if unearned(kv.Lease, named, live) == "" && derr == nil {
				return errors.Mark(errors.Newf("%s %q at %s: the identity was taken by %s %q at %s, a live member (lease %x), after this member's record was deleted or rewritten; not putting it back",
					r.m.Role, r.m.ID, r.m.Addr, m.Role, m.ID, m.Addr, kv.Lease), ErrConflict)
			}
		}
	}
	put, err := r.p.cli.Txn(ctx).
		If(cmp).
		Then(clientv3.OpPut(r.key, val, clientv3.WithLease(lease))).
		Commit()
	switch {
	case err != nil:
		if r.ctx.Err() == nil {
			log.Debug("cluster: putting the member's record back failed", zap.Int64("lease", int64(lease)), zap.Error(err))
		}
		return nil
	case !put.Succeeded:
		// Changed since it was read: the next keep-alive looks again.
		log.Debug("cluster: the member's record changed while being put back", zap.Int64("lease", int64(lease)), zap.String("found", found))
		return nil
	}
	log.Warn("cluster: the member's record was rewritten or deleted by someone else: put it back under its lease",
		zap.String("key", r.key), zap.Int64("lease", int64(lease)), zap.String("found", found))
	return nil
}

// renewOnce reports whether lease still exists (and renews it); false with
// no error means it expired.
func (p *Etcd) renewOnce(ctx context.Context, lease clientv3.LeaseID) (bool, error) {
	octx, cancel := p.opCtx(ctx)
	defer cancel()
	resp, err := p.cli.KeepAliveOnce(octx, lease)
	switch {
	case err == nil:
		return resp.TTL > 0, nil
	case isLeaseGone(err):
		return false, nil
	}
	return false, p.callErr(ctx, err, "renew lease %x", int64(lease))
}

// Close implements Registration: it stops the keep-alive and revokes the
// lease, so the key is deleted at once.
func (r *etcdReg) Close() error {
	r.closeOnce.Do(func() {
		r.cancel()
		<-r.exited
		r.mu.Lock()
		lease := r.lease
		r.mu.Unlock()
		if err := r.p.revoke(lease); err != nil {
			r.p.log.Warn("cluster: revoking a lease failed; the member leaves when its TTL runs out",
				zap.String("role", string(r.m.Role)), zap.String("id", r.m.ID), warnErr(err))
			r.closeErr = errors.Wrapf(err, "close %s %q", r.m.Role, r.m.ID)
		}
		r.p.mu.Lock()
		delete(r.p.regs, r)
		r.p.mu.Unlock()
		r.end(nil)
	})
	return r.closeErr
}
