package launch

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flakyLookups answers Lookup with errs, one per call, then with the member.
type flakyLookups struct {
	cluster.Provider
	errs  []error
	calls int
}

func (f *flakyLookups) Lookup(_ context.Context, role cluster.Role, id string) (cluster.Member, error) {
	f.calls++
	if f.calls <= len(f.errs) {
		return cluster.Member{}, f.errs[f.calls-1]
	}
	return cluster.Member{Role: role, ID: id, Addr: "127.0.0.1:1"}, nil
}

// An etcd pause longer than the member TTL: the lookup fails as unreachable
// during it, as not found until the instance registered again, and then
// resolves; the rank waits that out instead of failing its batch.
func TestResolveWaitsOutAnEtcdPause(t *testing.T) {
	unavailable := errors.Mark(errors.New("etcd unreachable at x"), cluster.ErrUnavailable)
	notFound := errors.Mark(errors.New("decode-0 not registered"), cluster.ErrNotFound)
	f := &flakyLookups{errs: []error{unavailable, unavailable, notFound}}
	m, err := resolvePatiently(context.Background(), cluster.NewResolver(f), "decode-0", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:1", m.Addr)
	assert.Equal(t, 4, f.calls, "three failed lookups, then the answer")
}

// An instance that stays away fails the lookup once the patience is spent,
// naming it and keeping the class; an error of another class fails at once.
func TestResolveGivesUp(t *testing.T) {
	notFound := errors.Mark(errors.New("decode-0 not registered"), cluster.ErrNotFound)
	f := &flakyLookups{errs: []error{notFound, notFound, notFound, notFound, notFound, notFound, notFound, notFound}}
	_, err := resolvePatiently(context.Background(), cluster.NewResolver(f), "decode-0", 200*time.Millisecond)
	require.Error(t, err)
	assert.True(t, errors.Is(err, cluster.ErrNotFound), "%v", err)
	assert.Contains(t, err.Error(), "decode instance decode-0: not resolvable for 200ms")
	assert.Less(t, f.calls, len(f.errs), "it stopped trying within its patience")

	invalid := errors.Mark(errors.New("bad id"), cluster.ErrInvalid)
	g := &flakyLookups{errs: []error{invalid}}
	_, err = resolvePatiently(context.Background(), cluster.NewResolver(g), "decode-0", time.Minute)
	require.Error(t, err)
	assert.True(t, errors.Is(err, cluster.ErrInvalid))
	assert.Equal(t, 1, g.calls, "not a pause: no second try")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h := &flakyLookups{errs: []error{notFound, notFound}}
	_, err = resolvePatiently(ctx, cluster.NewResolver(h), "decode-0", time.Minute)
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)
}
