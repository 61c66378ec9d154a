package netsec

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// A handler that panics costs its call, not the process. Protoactor's own
// methods are refused before their handler runs, so a panicking handler of
// another service stands in for any bug.
func TestGuardsRecoverPanics(t *testing.T) {
	boom := func() { panic("boom") }
	_, err := UnaryGuard(quiet)(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/other.Service/Call"},
		func(context.Context, any) (any, error) { boom(); return nil, nil })
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	require.NotContains(t, err.Error(), "boom", "the panic value is for the log, not the peer")

	err = StreamGuard(func() string { return "" }, nil, quiet)(nil, nil, &grpc.StreamServerInfo{FullMethod: "/other.Service/Stream"},
		func(any, grpc.ServerStream) error { boom(); return nil })
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)

	called := false
	_, err = UnaryGuard(quiet)(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/remote.Remoting/ListProcesses"},
		func(context.Context, any) (any, error) { called = true; return nil, nil })
	require.Equal(t, codes.Unimplemented, status.Code(err))
	require.False(t, called, "protoactor's unimplemented handler ran")
}

// FuzzValidateBatch: whatever batch passes ValidateBatch, protoactor's
// endpoint reader can take apart without panicking. The fuzz body does
// what onMessageBatch does before delivering (it cannot be called: it is
// unexported and needs a running node): index targets, senders and type
// names, and deserialize with the envelope's serializer.
func FuzzValidateBatch(f *testing.F) {
	const local = "127.0.0.1:9100"
	seed := func(b *remote.MessageBatch) {
		data, err := proto.Marshal(b)
		require.NoError(f, err)
		f.Add(data)
	}
	ping, _ := proto.Marshal(&Ping{Seq: 7})
	seed(&remote.MessageBatch{
		TypeNames: []string{"kvstream.netsec.Ping"},
		Targets:   []*actor.PID{actor.NewPID(local, "heartbeat")},
		Senders:   []*actor.PID{actor.NewPID("127.0.0.1:9200", "m")},
		Envelopes: []*remote.MessageEnvelope{{MessageData: ping, Sender: 1}},
	})
	seed(&remote.MessageBatch{
		TypeNames: []string{"actor.Terminated"},
		Targets:   []*actor.PID{actor.NewPID(local, "w")},
		Envelopes: []*remote.MessageEnvelope{{Target: 3, TypeId: -1, SerializerId: 1}},
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		var b remote.MessageBatch
		if proto.Unmarshal(data, &b) != nil || ValidateBatch(&b, local) != nil {
			return
		}
		for _, e := range b.Envelopes {
			target := b.Targets[e.Target]
			require.Equal(t, local, target.Address)
			if e.Sender > 0 {
				_ = b.Senders[e.Sender-1].Address
			}
			msg, err := remote.Deserialize(e.MessageData, b.TypeNames[e.TypeId], e.SerializerId)
			if err != nil {
				continue
			}
			switch m := msg.(type) {
			case *actor.Terminated:
				_ = m.Who.Address
			case *actor.Watch:
				_ = m.Watcher.Id
			case *actor.Unwatch:
				_ = m.Watcher.Id
			}
		}
	})
}
