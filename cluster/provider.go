package cluster

import (
	"context"
	"crypto/tls"
	"time"

	"go.uber.org/zap"
)

// Provider is a membership backend: etcd (NewEtcd) or in-process (NewLocal).
// All methods are safe for concurrent use.
type Provider interface {
	// Register adds m to the cluster until the returned registration is
	// closed (or, with etcd, until the process stops keeping its lease
	// alive). It fails with ErrInvalid for bad input and ErrConflict when
	// another live member holds m's role and id.
	Register(ctx context.Context, m Member) (Registration, error)
	// Lookup returns the member registered as (role, id), or an error
	// marked ErrNotFound.
	Lookup(ctx context.Context, role Role, id string) (Member, error)
	// List returns the members of a role, sorted by id.
	List(ctx context.Context, role Role) ([]Member, error)
	// Watch lists a role's members (sorted by id) and reports every change
	// after that listing, in order: initial plus the events is always the
	// exact membership. The channel closes when ctx ends or the provider
	// closes.
	Watch(ctx context.Context, role Role) (initial []Member, events <-chan Event, err error)
	// Close revokes every registration made through this provider, stops
	// its watches and releases its connections.
	Close() error
}

// Registration is one member's presence in the cluster.
type Registration interface {
	// Member is the registered record.
	Member() Member
	// Done is closed when the registration ended for good: Close, the
	// provider closing, or (etcd) the identity taken by another live
	// member, found by a rejoin after a lost lease or by the keep-alive's
	// check of the member's record (someone deleted the key and another
	// process registered the same role and id); Err is then marked
	// ErrConflict. A lost lease alone does not end it: the registration
	// rejoins as soon as etcd answers again.
	Done() <-chan struct{}
	// Err says why Done closed (nil after a clean Close).
	Err() error
	// Close removes the member at once (etcd: revokes its lease), so that
	// watchers see it leave without waiting for the TTL.
	Close() error
}

// Config selects and configures a provider. The zero value is the
// in-process provider.
type Config struct {
	// Endpoints are etcd client URLs ("http://10.0.0.5:2379"). Empty
	// selects the in-process provider, which only members of this process
	// can see.
	Endpoints []string
	// Prefix is the root of the keys (DefaultPrefix when empty); clusters
	// sharing one etcd use distinct prefixes.
	Prefix string
	// TTL is how long a member that stopped keeping alive stays visible
	// (DefaultTTL when zero). etcd counts whole seconds (rounded up) and
	// raises a TTL below its minimum (1.5 election timeouts) to it.
	TTL time.Duration
	// DialTimeout bounds the first connection to etcd (DefaultDialTimeout
	// when zero).
	DialTimeout time.Duration
	// OpTimeout bounds each call to etcd on top of the caller's context
	// (DefaultOpTimeout when zero): a call to an unreachable etcd fails
	// with ErrUnavailable after the shorter of the two.
	OpTimeout time.Duration
	// TLS, Username and Password are passed to the etcd client as they are
	// (client certificates, a private CA; etcd's own authentication).
	TLS      *tls.Config
	Username string
	Password string
	// Logger receives WARN on failures (a lost lease, a watch that had to
	// resync); nil is zap.NewNop.
	Logger *zap.Logger
}

// Defaults for Config's zero fields.
const (
	DefaultPrefix      = "/kvstream"
	DefaultTTL         = 5 * time.Second
	DefaultDialTimeout = 3 * time.Second
	DefaultOpTimeout   = 3 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// Open returns the provider cfg selects: etcd when cfg.Endpoints is set,
// the in-process provider otherwise.
func Open(cfg Config) (Provider, error) {
	if len(cfg.Endpoints) == 0 {
		return NewLocal(), nil
	}
	return NewEtcd(cfg)
}
