package decode

import (
	"net"
	"strconv"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/plan"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// TestAdvertised: a node on all interfaces advertises a routable address
// (never [::]); an explicit one is used as given, with the listen port.
func TestAdvertised(t *testing.T) {
	adv, port, lease, err := advertised("127.0.0.1", 9100, "")
	require.NoError(t, err)
	require.Equal(t, "", adv)
	require.Equal(t, 9100, port)
	require.Nil(t, lease, "no port chosen, none held")
	adv, port, _, err = advertised("0.0.0.0", 9100, "10.1.2.3")
	require.NoError(t, err)
	require.Equal(t, "10.1.2.3:9100", adv)
	require.Equal(t, 9100, port)
	adv, _, _, err = advertised("127.0.0.1", 0, "localhost:9200")
	require.NoError(t, err)
	require.Equal(t, "localhost:9200", adv)
	if _, rerr := RoutableIP(); rerr == nil {
		adv, port, lease, err = advertised("0.0.0.0", 0, "")
		require.NoError(t, err)
		require.NotZero(t, port)
		require.NotContains(t, adv, "[::]")
		require.NotContains(t, adv, "0.0.0.0")
		// The chosen port is held for the node's listener alone: nothing
		// else is given it before the node listens.
		require.NotNil(t, lease)
		require.Equal(t, port, lease.Port)
		heldForListener(t, port)
		l, lerr := net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)))
		require.NoError(t, lerr, "the node's listener binds the held port")
		require.NoError(t, l.Close())
		lease.Release()
	}
	for _, bad := range []string{"[::]:9100", "0.0.0.0", ":9100", "h:x", "h:70000"} {
		_, _, _, err := advertised("0.0.0.0", 9100, bad)
		require.Error(t, err, bad)
		require.True(t, errors.Is(err, ErrBadInput), bad)
	}
}

// TestClearTextOnlyOnLoopback: a node on any other address needs TLS, and
// the error names the address.
func TestClearTextOnlyOnLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0", "10.1.2.3:0"} {
		_, err := Listen(addr, nil)
		require.ErrorContains(t, err, addr)
		require.True(t, errors.Is(err, ErrBadInput), addr)
	}
}

// FuzzCheckOffer: an Offer decoded from fuzz bytes (what a rogue decode
// could answer a Hello with) is checked without panicking, and one that
// passes has only regions the transport can import.
func FuzzCheckOffer(f *testing.F) {
	good, _ := proto.Marshal(&wire.Offer{Version: ProtocolVersion, Session: "t", PeerId: "decode", WorkerAddress: []byte{0x20, 1},
		Regions: []*wire.Region{{Addr: 4096, Len: 64 * 16, Key: []byte{1}, ItemLen: 64}, {Addr: 8192, Len: 64 * 16, Key: []byte{1}, ItemLen: 64}}})
	f.Add(good)
	f.Add([]byte{})
	bufs := []plan.Buffer{{Name: "k", ItemLen: 64, Pages: 16}, {Name: "v", ItemLen: 64, Pages: 16}}
	f.Fuzz(func(t *testing.T, data []byte) {
		var o wire.Offer
		if proto.Unmarshal(data, &o) != nil || len(o.Regions) != len(bufs) {
			return
		}
		if checkOffer(&o, bufs) != nil {
			return
		}
		for _, r := range o.Regions {
			require.NotZero(t, r.Len)
			require.GreaterOrEqual(t, r.Addr+r.Len, r.Addr)
			require.Zero(t, r.Len%r.ItemLen)
		}
	})
}
