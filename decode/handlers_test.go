package decode

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// handlerRig is a Server whose handlers the tests call directly, as its
// actor would with a message decoded from the network.
type handlerRig struct {
	srv   *Server
	sized bool // Size ran
}

func newHandlerRig(tb testing.TB, size bool) *handlerRig {
	tb.Helper()
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(tb, err)
	pool, err := hostmem.Alloc(2 * 64 * 16)
	require.NoError(tb, err)
	node, err := Listen("127.0.0.1:0", nil)
	require.NoError(tb, err)
	h := &handlerRig{}
	cfg := Config{AcceptUnknownRooms: true, ByeGrace: time.Millisecond, MaxPoolBytes: 1 << 20}
	bufs := []Buffer{{Name: "k", Base: pool.Addr, ItemLen: 64, Pages: 16}, {Name: "v", Base: pool.Addr + 64*16, ItemLen: 64, Pages: 16}}
	if size {
		cfg.Size = func([]PrefillBuffer) ([]Buffer, error) { h.sized = true; return bufs, nil }
	} else {
		cfg.Buffers = bufs
	}
	h.srv, err = New(node, tr, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		assert.NoError(tb, h.srv.Close(ctx))
		assert.NoError(tb, node.Close(ctx))
		_ = tr.Close()
		_ = pool.Free()
	})
	return h
}

var prefillNode = actor.NewPID("127.0.0.1:7", "future$1")

func validHello() *wire.Hello {
	return &wire.Hello{Version: ProtocolVersion, Prefill: "p", SessionAddress: prefillNode.Address, SessionId: "s",
		Buffers: []*wire.Buffer{{Name: "k", ItemLen: 64, Pages: 16}, {Name: "v", ItemLen: 64, Pages: 16}}}
}

// end forgets a session the test opened, as its prefill leaving would.
func (h *handlerRig) end(ss *Session) {
	if ss != nil {
		h.srv.left(actor.NewPID(prefillNode.Address, "s"), nil)
	}
}

// TestHelloGeometryIsBounded: a Hello whose layout exceeds the pool's
// bound, or whose product or sum wraps around 2^64, is refused before Size
// runs; names and metadata are bounded.
func TestHelloGeometryIsBounded(t *testing.T) {
	h := newHandlerRig(t, true)
	for name, mutate := range map[string]func(*wire.Hello){
		"over the bound":       func(m *wire.Hello) { m.Buffers[0].Pages = 1 << 20 },
		"product wraps":        func(m *wire.Hello) { m.Buffers[0].ItemLen, m.Buffers[0].Pages = 1<<63, 2 },
		"sum wraps":            func(m *wire.Hello) { m.Buffers[1].ItemLen, m.Buffers[1].Pages = 1<<62, 4 },
		"zero pages":           func(m *wire.Hello) { m.Buffers[0].Pages = 0 },
		"zero item length":     func(m *wire.Hello) { m.Buffers[0].ItemLen = 0 },
		"nil buffer":           func(m *wire.Hello) { m.Buffers[1] = nil },
		"long name":            func(m *wire.Hello) { m.Buffers[0].Name = strings.Repeat("x", 1000) },
		"long prefill name":    func(m *wire.Hello) { m.Prefill = strings.Repeat("x", 1000) },
		"too much metadata":    func(m *wire.Hello) { m.Metadata = map[string]string{"k": strings.Repeat("x", 5000)} },
		"too many buffers":     func(m *wire.Hello) { m.Buffers = make([]*wire.Buffer, maxBuffers+1) },
		"another node's actor": func(m *wire.Hello) { m.SessionAddress = "127.0.0.1:8" },
	} {
		m := validHello()
		mutate(m)
		offer, ss := h.srv.hello(prefillNode, "", m)
		require.Nil(t, ss, name)
		require.NotEqual(t, wire.Code_OK, offer.Code, name)
		require.Empty(t, offer.WorkerAddress, "%s: nothing offered", name)
		require.False(t, h.sized, "%s: Size ran", name)
	}
	offer, ss := h.srv.hello(prefillNode, "", validHello())
	require.Equal(t, wire.Code_OK, offer.Code, offer.Error)
	require.True(t, h.sized)
	h.end(ss)
}

func TestLayoutBytes(t *testing.T) {
	require.NoError(t, layoutBytes([]PrefillBuffer{{ItemLen: 1 << 10, Pages: 1 << 10}}, 1<<20))
	require.Error(t, layoutBytes([]PrefillBuffer{{ItemLen: 1 << 10, Pages: 1<<10 + 1}}, 1<<20))
	require.Error(t, layoutBytes([]PrefillBuffer{{ItemLen: 1 << 63, Pages: 2}}, 1<<64-1))
	require.Error(t, layoutBytes([]PrefillBuffer{{ItemLen: 1 << 63, Pages: 1}, {ItemLen: 1 << 63, Pages: 1}}, 1<<64-1))
}

// TestAdvertised: a node on all interfaces advertises a routable address
// (never [::]); an explicit one is used as given, with the listen port.
func TestAdvertised(t *testing.T) {
	adv, port, err := advertised("127.0.0.1", 9100, "")
	require.NoError(t, err)
	require.Equal(t, "", adv)
	require.Equal(t, 9100, port)
	adv, port, err = advertised("0.0.0.0", 9100, "10.1.2.3")
	require.NoError(t, err)
	require.Equal(t, "10.1.2.3:9100", adv)
	require.Equal(t, 9100, port)
	adv, _, err = advertised("127.0.0.1", 0, "localhost:9200")
	require.NoError(t, err)
	require.Equal(t, "localhost:9200", adv)
	if _, rerr := RoutableIP(); rerr == nil {
		adv, port, err = advertised("0.0.0.0", 0, "")
		require.NoError(t, err)
		require.NotZero(t, port)
		require.NotContains(t, adv, "[::]")
		require.NotContains(t, adv, "0.0.0.0")
	}
	for _, bad := range []string{"[::]:9100", "0.0.0.0", ":9100", "h:x", "h:70000"} {
		_, _, err := advertised("0.0.0.0", 9100, bad)
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

// FuzzHandlers feeds the server's handlers control messages decoded from
// fuzz bytes, as its actor would receive them from the network: nothing may
// panic, and a message either opens a session or is refused. With session
// set, the message is made to pass the session checks (a live session's
// token, the session's node), to reach the checks behind them.
func FuzzHandlers(f *testing.F) {
	hello, _ := proto.Marshal(validHello())
	notice, _ := proto.Marshal(&wire.ChunkNotice{Room: 1, Start: 0, End: 16, Last: true, Positions: []int64{0, 1}, DstPages: []int64{3, 4}})
	bye, _ := proto.Marshal(&wire.Bye{Chunks: 1})
	f.Add(byte(0), hello, true)
	f.Add(byte(0), hello, false)
	f.Add(byte(1), notice, true)
	f.Add(byte(1), notice, false)
	f.Add(byte(2), bye, true)
	f.Add(byte(1), []byte{}, true)
	h := newHandlerRig(f, false)
	f.Fuzz(func(t *testing.T, kind byte, data []byte, session bool) {
		var ss *Session
		if session && kind%3 != 0 {
			var offer *wire.Offer
			offer, ss = h.srv.hello(prefillNode, "", validHello())
			require.Equal(t, wire.Code_OK, offer.Code, offer.Error)
			defer h.end(ss)
		}
		switch kind % 3 {
		case 0:
			var m wire.Hello
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			if session {
				m.Version, m.SessionAddress, m.SessionId = ProtocolVersion, prefillNode.Address, "s"
			}
			offer, opened := h.srv.hello(prefillNode, "", &m)
			require.Equal(t, opened != nil, offer.Code == wire.Code_OK)
			h.end(opened)
		case 1:
			var m wire.ChunkNotice
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			if ss != nil {
				m.Session = ss.token
			}
			h.srv.notice(prefillNode, "", &m)
		case 2:
			var m wire.Bye
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			if ss != nil {
				m.Session = ss.token
			}
			h.srv.bye(prefillNode, "", &m)
		}
	})
}

// FuzzCheckOffer: an Offer decoded from fuzz bytes (what a rogue decode
// could answer a Hello with) is checked without panicking, and one that
// passes has only regions the transport can import.
func FuzzCheckOffer(f *testing.F) {
	good, _ := proto.Marshal(&wire.Offer{Version: ProtocolVersion, Session: "t", PeerId: "decode", WorkerAddress: []byte{0x20, 1},
		Regions: []*wire.Region{{Addr: 4096, Len: 64 * 16, Key: []byte{1}, ItemLen: 64}, {Addr: 8192, Len: 64 * 16, Key: []byte{1}, ItemLen: 64}}})
	f.Add(good)
	f.Add([]byte{})
	bufs := []system.Buffer{{Name: "k", ItemLen: 64, Pages: 16}, {Name: "v", ItemLen: 64, Pages: 16}}
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
