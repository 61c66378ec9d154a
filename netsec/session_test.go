package netsec

import (
	"net"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

func TestSessionPolicy(t *testing.T) {
	p := NewSessionPolicy("decode")
	prefill := Identity{CommonName: "prefill", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	other := Identity{CommonName: "other", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	to := func(id, typeName string) Envelope {
		return Envelope{Target: actor.NewPID("127.0.0.1:9100", id), Sender: actor.NewPID("127.0.0.1:9200", "prefill"), TypeName: typeName}
	}

	require.ErrorIs(t, p.Authorize(Identity{}, to("decode", "kvstream.wire.Hello")), ErrUnauthenticated)
	require.NoError(t, p.Authorize(other, to("decode", "kvstream.wire.Hello")), "unbound: any authenticated peer")
	require.ErrorContains(t, p.Authorize(prefill, to("EndpointSupervisor", "kvstream.wire.Hello")), `"EndpointSupervisor"`)
	require.NoError(t, p.Authorize(prefill, to("future$1f", "kvstream.wire.Hello")), "answers to this node's requests")
	for _, typ := range []string{"actor.Stop", "actor.PoisonPill", "actor.Touch"} {
		require.ErrorContains(t, p.Authorize(prefill, to("decode", typ)), typ)
	}

	require.Error(t, p.Bind(""))
	require.NoError(t, p.Bind("prefill"))
	require.NoError(t, p.Bind("prefill"))
	require.Equal(t, []string{"prefill"}, p.Bound())
	require.NoError(t, p.Authorize(prefill, to("decode", "kvstream.wire.Hello")))
	require.ErrorContains(t, p.Authorize(other, to("decode", "kvstream.wire.Hello")), `"other" is not the peer of any session`)
	// An open actor hears everyone: a server answers a refusal rather than
	// let the peer's stream be cut.
	p.Open("server")
	require.NoError(t, p.Authorize(other, to("server", "kvstream.wire.Hello")))
	require.ErrorIs(t, p.Authorize(Identity{}, to("server", "kvstream.wire.Hello")), ErrUnauthenticated)
	require.ErrorContains(t, p.Authorize(other, to("server", "actor.Stop")), "actor.Stop")
	// A prefix opens actors that do not exist yet: the node answers a
	// message for a missing one (a dead letter) instead of cutting the
	// stream.
	p.OpenPrefix("kvstream-decode")
	require.NoError(t, p.Authorize(other, to("kvstream-decode-rank-9", "kvstream.wire.Hello")))
	require.NoError(t, p.AuthorizeLocal(to("kvstream-decode-x", "kvstream.wire.Hello")))
	require.ErrorContains(t, p.Authorize(other, to("kvstream-prefill-1", "kvstream.wire.Hello")), `"other"`)
	// Several peers at once, each counted per session.
	require.NoError(t, p.Bind("other"))
	require.NoError(t, p.Authorize(other, to("decode", "kvstream.wire.Hello")))
	p.Unbind("other")
	require.ErrorContains(t, p.Authorize(other, to("decode", "kvstream.wire.Hello")), `"other"`)
	p.Unbind("prefill")
	require.NoError(t, p.Authorize(prefill, to("decode", "kvstream.wire.Hello")), "one session of prefill's left")

	watch := func(host string) Envelope {
		e := to("decode", "actor.Watch")
		e.Data, _ = proto.Marshal(&actor.Watch{Watcher: actor.NewPID(host+":9200", "prefill-session")})
		return e
	}
	require.NoError(t, p.Authorize(prefill, watch("127.0.0.1")))
	require.ErrorContains(t, p.Authorize(prefill, watch("10.1.2.3")), `"10.1.2.3"`)

	p.Unbind("prefill")
	require.Empty(t, p.Bound())
	require.NoError(t, p.Authorize(other, to("decode", "kvstream.wire.Hello")))
	p.Allow("late")
	require.NoError(t, p.Authorize(other, to("late", "kvstream.wire.Hello")))
	p.Forbid("late")
	require.ErrorContains(t, p.Authorize(other, to("late", "kvstream.wire.Hello")), `"late"`)
}

// TestSessionPolicyLocalRules: what a plaintext node still enforces.
func TestSessionPolicyLocalRules(t *testing.T) {
	p := NewSessionPolicy("decode")
	to := func(id, typeName string) Envelope {
		return Envelope{Target: actor.NewPID("127.0.0.1:9100", id), TypeName: typeName}
	}
	require.NoError(t, p.AuthorizeLocal(to("decode", "kvstream.wire.Hello")))
	require.NoError(t, p.AuthorizeLocal(to("future$3", "kvstream.wire.Offer")))
	err := p.AuthorizeLocal(to("EndpointSupervisor", "actor.Watch"))
	require.ErrorContains(t, err, `"EndpointSupervisor"`)
	require.True(t, errors.Is(err, ErrNotServed), "an actor not served: the guard may answer a request for it")
	err = p.AuthorizeLocal(to("decode", "actor.Stop"))
	require.ErrorContains(t, err, "actor.Stop")
	require.False(t, errors.Is(err, ErrNotServed), "a refused type is refused, never answered")
}
