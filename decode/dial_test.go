package decode_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/internal/nettest"
	"github.com/kvstream/kvstream/netsec"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// patient is a Dial config that would wait a minute for an answer: a
// refusal that comes back as an answer returns its class long before, a
// timeout would fail the test's context instead.
func patient(addr string) decode.DialConfig {
	return decode.DialConfig{Decode: addr, Buffers: prefillLayout(itemLen), PageSize: 4, CallTimeout: time.Minute}
}

func dialCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestDialSaysWhy: every way a Dial fails says what happened, by class,
// instead of timing out: nothing listening, a server name the node does not
// have, a Hello refused.
func TestDialSaysWhy(t *testing.T) {
	limited := &limitRefusals{seen: make(chan struct{}, 16)}
	r := newRig(t, decode.Config{MaxSessions: 1, Observer: limited})
	nobody := nettest.Refusing(t)

	_, err := decode.Dial(dialCtx(t), r.node, patient(nobody))
	assert.True(t, errors.Is(err, decode.ErrUnreachable), "%v", err)
	assert.ErrorContains(t, err, "nothing listening at "+nobody)

	cfg := patient(r.srv.Addr())
	cfg.Server = "rank-9"
	_, err = decode.Dial(dialCtx(t), r.node, cfg)
	assert.True(t, errors.Is(err, decode.ErrRefused), "%v", err)
	assert.ErrorContains(t, err, `has no decode server named "rank-9"`)

	c := r.dial(t)
	cfg = patient(r.srv.Addr())
	cfg.Name = "second"
	_, err = decode.Dial(dialCtx(t), r.node, cfg)
	assert.True(t, errors.Is(err, decode.ErrUnavailable), "%v", err)
	assert.ErrorContains(t, err, "already 1 sessions")

	limited.wait(t) // that refusal

	// With a connect timeout the unavailable is retried: the first
	// session's goodbye, said once the server refused this Dial too (so
	// that every run retries), makes room.
	cfg.ConnectTimeout = 15 * time.Second
	bye := make(chan error, 1)
	go func() {
		select {
		case <-limited.seen:
			_, err := c.Bye(context.Background(), nil)
			bye <- err
		case <-time.After(20 * time.Second):
			bye <- errors.New("the retrying Dial was never refused")
		}
	}()
	c2, err := decode.Dial(dialCtx(t), r.node, cfg)
	require.NoError(t, err)
	require.NoError(t, <-bye)
	require.NoError(t, c2.Close(context.Background()))
}

// limitRefusals is an Observer that signals each Hello refused for the
// server's session bound (MaxSessions). It never blocks the server's
// actor: a signal with the buffer full is dropped (a retrying Dial is
// refused a dozen times at most in its 15 s).
type limitRefusals struct{ seen chan struct{} }

func (o *limitRefusals) Refused(message, reason string) {
	if message == "hello" && reason == "limit" {
		select {
		case o.seen <- struct{}{}:
		default:
		}
	}
}

// wait returns at the next signalled refusal.
func (o *limitRefusals) wait(t *testing.T) {
	t.Helper()
	select {
	case <-o.seen:
	case <-dialCtx(t).Done():
		t.Fatal("no Hello refused for the session bound")
	}
}
func (*limitRefusals) SessionEnded(string) {}
func (*limitRefusals) RoomEnded(string)    {}
func (*limitRefusals) Verified(uint64)     {}
func (*limitRefusals) Quarantined(int)     {}

// TestDialSaysWhyWithTLS: with mutual TLS, a decode certificate without
// the expected name is an authentication failure before anything is said.
// (A prefill the decode does not serve hears its refusal with its reason:
// decode/internal/core/testdata/refusals.txt, and across processes in
// cmd/kvstream.)
func TestDialSaysWhyWithTLS(t *testing.T) {
	dir := t.TempDir()
	files, err := netsec.GenerateDevCerts(dir, []string{"decode"}, []string{"127.0.0.1"})
	require.NoError(t, err)
	tlsm, err := netsec.LoadTLS(files["decode"])
	require.NoError(t, err)
	// One node plays both sides (one node per process): its certificate
	// names it "decode", which is also the prefill's name the server sees.
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0", TLS: tlsm})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close(context.Background()) })
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	pool, err := hostmem.Alloc(buffers * itemLen * pages)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pool.Free() })
	srv, err := decode.New(node, tr, decode.Config{Buffers: decodeBuffers(pool), Prefills: []string{"prefill"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close(context.Background()) })

	cfg := patient(srv.Addr())
	cfg.DecodeName = "decode-1"
	_, err = decode.Dial(dialCtx(t), node, cfg)
	assert.True(t, errors.Is(err, decode.ErrAuthentication), "%v", err)
	assert.ErrorContains(t, err, `presented a certificate for "decode", not "decode-1"`)
}
