package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Etcd is the provider on a real etcd. A member's key lives under a lease
// that a keep-alive holds for as long as the process lives; the layout is
//
//	<prefix>/members/<role>/<id> = JSON of record (the Member and its lease), attached to that lease
type Etcd struct {
	cfg    Config
	cli    *clientv3.Client
	log    *zap.Logger
	ttlSec int64
	ctx    context.Context // ends at Close: every watch and keep-alive derives from it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	regs   map[*etcdReg]struct{}
	// warned holds the records already reported as ignored (key and
	// revision), so that a forged record is logged once, not at every
	// listing; bounded.
	warned map[string]int64
}

var _ Provider = (*Etcd)(nil)

// NewEtcd connects to the etcd at cfg.Endpoints and checks that it answers
// within cfg.DialTimeout (an error marked ErrUnavailable otherwise).
func NewEtcd(cfg Config) (*Etcd, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Endpoints) == 0 {
		return nil, errors.Mark(errors.New("etcd provider: no endpoints"), ErrInvalid)
	}
	for _, ep := range cfg.Endpoints {
		if err := validateEndpoint(ep); err != nil {
			return nil, err
		}
		if cfg.TLS != nil && strings.HasPrefix(ep, "http://") {
			return nil, errors.Mark(errors.Newf("etcd endpoint %q: TLS is configured, so the endpoint is https://", ep), ErrInvalid)
		}
	}
	if err := validatePrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		TLS:         cfg.TLS,
		Username:    cfg.Username,
		Password:    cfg.Password,
		// The client logs every retry against a stopped etcd at WARN; this
		// package reports what a caller needs to know itself.
		Logger: cfg.Logger.WithOptions(zap.IncreaseLevel(zap.ErrorLevel)),
	})
	if err != nil {
		return nil, markUnavailable(errors.Wrapf(err, "etcd client for %v", cfg.Endpoints), cfg.Endpoints)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Etcd{
		cfg:    cfg,
		cli:    cli,
		log:    cfg.Logger,
		ttlSec: int64((cfg.TTL + time.Second - 1) / time.Second),
		ctx:    ctx,
		cancel: cancel,
		regs:   map[*etcdReg]struct{}{},
		warned: map[string]int64{},
	}
	// A wrong address or a stopped etcd shows now, not at the first
	// registration.
	pctx, pcancel := context.WithTimeout(ctx, cfg.DialTimeout)
	_, err = cli.Get(pctx, p.keyPrefix(), clientv3.WithCountOnly())
	pcancel()
	if err != nil {
		cancel()
		_ = cli.Close()
		return nil, p.callErr(context.Background(), err, "connect")
	}
	return p, nil
}

func validateEndpoint(ep string) error {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return errors.Mark(errors.Wrapf(err, "etcd endpoint %q", ep), ErrInvalid)
		}
		if u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix" && u.Scheme != "unixs" {
			return errors.Mark(errors.Newf("etcd endpoint %q: scheme %q (want http or https)", ep, u.Scheme), ErrInvalid)
		}
		if u.Scheme == "http" || u.Scheme == "https" {
			if err := validateHostPort(u.Host); err != nil {
				return errors.Wrapf(err, "etcd endpoint %q", ep)
			}
		}
		return nil
	}
	if err := validateHostPort(ep); err != nil {
		return errors.Wrapf(err, "etcd endpoint %q", ep)
	}
	return nil
}

// validateHostPort is ValidateAddr without the wildcard rule: an etcd on
// 0.0.0.0 is reachable locally.
func validateHostPort(hp string) error { return checkAddr(hp, true) }

func validatePrefix(prefix string) error {
	if !strings.HasPrefix(prefix, "/") || strings.HasSuffix(prefix, "/") || strings.Contains(prefix, "//") {
		return errors.Mark(errors.Newf("key prefix %q: want an absolute path without a trailing slash, like %q", prefix, DefaultPrefix), ErrInvalid)
	}
	return nil
}

func (p *Etcd) keyPrefix() string        { return p.cfg.Prefix + "/members/" }
func (p *Etcd) rolePrefix(r Role) string { return p.keyPrefix() + string(r) + "/" }
func (p *Etcd) key(r Role, id string) string {
	return p.rolePrefix(r) + id
}

// opCtx bounds one call by the caller's context and Config.OpTimeout.
func (p *Etcd) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.cfg.OpTimeout)
}

// callErr wraps an etcd call's failure; a failure to reach etcd in time is
// marked ErrUnavailable. A caller that cancelled gets its own cancellation.
func (p *Etcd) callErr(caller context.Context, err error, format string, args ...any) error {
	err = errors.Wrapf(err, format, args...)
	if errors.Is(caller.Err(), context.Canceled) {
		return err
	}
	if isUnreachable(err) {
		return markUnavailable(err, p.cfg.Endpoints)
	}
	return err
}

func markUnavailable(err error, endpoints []string) error {
	return errors.Mark(errors.Wrapf(err, "etcd unreachable at %s", strings.Join(endpoints, ",")), ErrUnavailable)
}

func isUnreachable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, clientv3.ErrNoAvailableEndpoints) {
		return true
	}
	// etcd's own errors for a cluster that cannot serve (no leader, a
	// request timed out in raft) carry the code Unavailable, like a
	// connection that cannot be made.
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable || ee.Code() == codes.DeadlineExceeded
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		switch se.GRPCStatus().Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return true
		}
	}
	return false
}

// record is the value of a member's key: the member, and the lease it
// registered under. The key is attached to that same lease; a reader takes
// the record as a member only when both agree and the lease is alive, so a
// record rewritten or copied under another lease (a live one included) is
// not the member's, whoever wrote it.
type record struct {
	Member
	Lease int64 `json:"lease"`
}

// value is the JSON of m's record under lease.
func value(m Member, lease clientv3.LeaseID) string {
	// A record holds only strings and integers: marshalling cannot fail.
	b, _ := json.Marshal(record{Member: m, Lease: int64(lease)})
	return string(b)
}

// decode parses a member record and checks it belongs under key; it also
// returns the lease the record names (0 if none).
func (p *Etcd) decode(key string, val []byte) (Member, int64, error) {
	var rec record
	if err := json.Unmarshal(val, &rec); err != nil {
		return Member{}, 0, errors.Wrapf(err, "record at %q", key)
	}
	m := rec.Member
	if err := m.Validate(); err != nil {
		return Member{}, 0, errors.Wrapf(err, "record at %q", key)
	}
	if want := p.key(m.Role, m.ID); want != key {
		return Member{}, 0, errors.Newf("record at %q describes %s %q", key, m.Role, m.ID)
	}
	return m, rec.Lease, nil
}

// Lookup implements Provider.
func (p *Etcd) Lookup(ctx context.Context, role Role, id string) (Member, error) {
	if err := role.Validate(); err != nil {
		return Member{}, err
	}
	if err := ValidateID(id); err != nil {
		return Member{}, err
	}
	if err := p.checkOpen("lookup %s %q", role, id); err != nil {
		return Member{}, err
	}
	octx, cancel := p.opCtx(ctx)
	defer cancel()
	key := p.key(role, id)
	resp, err := p.cli.Get(octx, key)
	if err != nil {
		return Member{}, p.callErr(ctx, err, "lookup %s %q", role, id)
	}
	if len(resp.Kvs) == 0 {
		return Member{}, errors.Mark(errors.Newf("lookup %s %q: not registered", role, id), ErrNotFound)
	}
	kv := resp.Kvs[0]
	m, named, err := p.decode(key, kv.Value)
	if err != nil {
		return Member{}, err
	}
	live, err := p.liveLeases(octx, []int64{kv.Lease})
	if err != nil {
		return Member{}, p.callErr(ctx, err, "lookup %s %q: its lease", role, id)
	}
	if why := unearned(kv.Lease, named, live); why != "" {
		p.ignored(key, kv.ModRevision, why)
		return Member{}, errors.Mark(errors.Newf("lookup %s %q: the record at %q is not a member's: %s", role, id, key, why), ErrNotFound)
	}
	return m, nil
}

// unearned says why a record whose key is attached to lease, and which
// names the lease named, is not a live member's ("" when it is): a member
// registers under a lease that its process keeps alive and names it in
// its record, so a record without a lease, or attached to another lease
// than the one it names, was written by someone else; one whose lease is
// gone outlived its member.
func unearned(lease, named int64, live map[int64]bool) string {
	switch {
	case lease == 0:
		return "it has no lease (members register under one; anyone who can write to etcd can forge a record)"
	case named != lease:
		return fmt.Sprintf("it is attached to lease %x but names lease %x (a member's record names the lease it is attached to; this one was rewritten or copied)", lease, named)
	case !live[lease]:
		return fmt.Sprintf("its lease %x is gone", lease)
	}
	return ""
}

// liveLeases says which of ids (0 ignored) are leases etcd still holds:
// one call listing every lease, or, where that is refused (etcd's
// authentication may forbid it), one TimeToLive per lease.
func (p *Etcd) liveLeases(ctx context.Context, ids []int64) (map[int64]bool, error) {
	live := map[int64]bool{}
	want := 0
	for _, id := range ids {
		if id != 0 {
			want++
		}
	}
	if want == 0 {
		return live, nil
	}
	if resp, err := p.cli.Leases(ctx); err == nil {
		for _, l := range resp.Leases {
			live[int64(l.ID)] = true
		}
		return live, nil
	} else if isUnreachable(err) {
		return nil, err
	}
	for _, id := range ids {
		if id == 0 || live[id] {
			continue
		}
		resp, err := p.cli.TimeToLive(ctx, clientv3.LeaseID(id))
		switch {
		case err == nil:
			live[id] = resp.TTL > 0
		case isLeaseGone(err):
		default:
			return nil, err
		}
	}
	return live, nil
}

// ignored logs, once per record version, a record that is not taken as a
// member.
func (p *Etcd) ignored(key string, rev int64, why string) {
	p.mu.Lock()
	seen := p.warned[key] == rev
	if !seen {
		if len(p.warned) >= 1024 {
			clear(p.warned)
		}
		p.warned[key] = rev
	}
	p.mu.Unlock()
	if !seen {
		p.log.Warn("cluster: ignoring a member record", zap.String("key", key), zap.Int64("revision", rev), zap.String("why", why))
	}
}

// List implements Provider. A record that does not parse is skipped with a
// WARN: one bad key must not hide the rest of the cluster.
func (p *Etcd) List(ctx context.Context, role Role) ([]Member, error) {
	if err := role.Validate(); err != nil {
		return nil, err
	}
	if err := p.checkOpen("list %s", role); err != nil {
		return nil, err
	}
	ms, _, err := p.list(ctx, role)
	return ms, err
}

func (p *Etcd) list(ctx context.Context, role Role) ([]Member, int64, error) {
	octx, cancel := p.opCtx(ctx)
	defer cancel()
	resp, err := p.cli.Get(octx, p.rolePrefix(role), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, p.callErr(ctx, err, "list %s", role)
	}
	leases := make([]int64, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		leases = append(leases, kv.Lease)
	}
	live, err := p.liveLeases(octx, leases)
	if err != nil {
		return nil, 0, p.callErr(ctx, err, "list %s: their leases", role)
	}
	out := make([]Member, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		m, named, err := p.decode(string(kv.Key), kv.Value)
		if err != nil {
			p.ignored(string(kv.Key), kv.ModRevision, err.Error())
			continue
		}
		if why := unearned(kv.Lease, named, live); why != "" {
			p.ignored(string(kv.Key), kv.ModRevision, why)
			continue
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out, resp.Header.Revision, nil
}

func (p *Etcd) checkOpen(format string, args ...any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.Mark(errors.Newf(format+": provider closed", args...), ErrClosed)
	}
	return nil
}

// Close implements Provider: it revokes every registration's lease (in
// parallel, each bounded by Config.OpTimeout), ends every watch and closes
// the client. The error is the first revocation that failed; those members
// still vanish when their TTL runs out.
func (p *Etcd) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	regs := make([]*etcdReg, 0, len(p.regs))
	for r := range p.regs {
		regs = append(regs, r)
	}
	p.mu.Unlock()
	errs := make([]error, len(regs))
	var wg sync.WaitGroup
	for i, r := range regs {
		wg.Go(func() { errs[i] = r.Close() })
	}
	wg.Wait()
	p.cancel()
	p.wg.Wait()
	cerr := p.cli.Close()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	if cerr != nil && !errors.Is(cerr, context.Canceled) {
		return errors.Wrap(cerr, "close etcd client")
	}
	return nil
}

// warnErr is an error for a WARN line: its message only. zap.Error of a
// cockroachdb error adds its stack trace (errorVerbose), which an
// expected event (etcd away, a lease lost) does not need; DEBUG lines keep
// it.
func warnErr(err error) zap.Field {
	if err == nil {
		return zap.Skip()
	}
	return zap.String("error", err.Error())
}
