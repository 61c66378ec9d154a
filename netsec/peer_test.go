package netsec

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// node is one protoactor remote node started with this package's options.
// A test binary starts only one (see fx).
type node struct {
	system *actor.ActorSystem
	remote *remote.Remote
}

func startNode(o Options) (*node, error) {
	system := actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
			return slog.New(slog.NewTextHandler(io.Discard, nil))
		}),
		// The dead-letter log throttle starts a goroutine that nothing
		// stops and that lives for this interval after the first dead
		// letter (a tick or Pong reaching a stopped monitor): keep it
		// within goleak's retries instead of filtering it.
		actor.WithDeadLetterThrottleInterval(10*time.Millisecond),
	)
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(&guardLog, nil))
	}
	opts, err := RemoteOptions(system, "127.0.0.1:0", o)
	if err != nil {
		return nil, err
	}
	r := remote.NewRemote(system, remote.Configure("127.0.0.1", 0, opts...))
	r.Start()
	return &node{system: system, remote: r}, nil
}

// stop stops the endpoint actors (outgoing connections) and then the gRPC
// server rather than calling Shutdown(true), which races with connection
// goroutines (see lab/simsession's node.stop).
func (n *node) stop() {
	for _, id := range []string{"EndpointSupervisor", "activator"} {
		if _, ok := n.system.ProcessRegistry.GetLocal(id); ok {
			_ = n.system.Root.StopFuture(actor.NewPID(n.system.Address(), id)).Wait()
		}
	}
	n.remote.Shutdown(false)
	n.system.Shutdown()
}

// guardLog collects what the guards of a test node log.
var guardLog lockedBuffer

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// delivery is one message a peerNode received for one of its actors.
type delivery struct {
	target, sender *actor.PID
	msg            any
}

// peerNode speaks protoactor remote's wire protocol by hand, with no actor
// system: a gRPC server that node dials to deliver to the peer's actors,
// and one stream to the node to deliver to its actors. It stands in for a
// second node, which one test process cannot start (see node), and lets a
// test make the peer stop answering at a moment of its choosing.
type peerNode struct {
	srv     *grpc.Server
	addr    string
	handle  func(delivery)
	hang    chan struct{} // closed: stop reading, as a SIGSTOPped process
	hangOne sync.Once

	mu   sync.Mutex
	conn *grpc.ClientConn
	out  remote.Remoting_ReceiveClient
}

type peerServer struct {
	remote.UnimplementedRemotingServer
	p *peerNode
}

func (s peerServer) Receive(stream remote.Remoting_ReceiveServer) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil
		}
		select {
		case <-s.p.hang:
			<-stream.Context().Done()
			return nil
		default:
		}
		if m.GetConnectRequest() != nil {
			if err := stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectResponse{
				ConnectResponse: &remote.ConnectResponse{MemberId: "peer"}}}); err != nil {
				return nil
			}
			continue
		}
		b := m.GetMessageBatch()
		for _, e := range b.GetEnvelopes() {
			d := delivery{target: b.Targets[e.Target]}
			if e.Sender > 0 {
				d.sender = b.Senders[e.Sender-1]
			}
			if d.msg, err = remote.Deserialize(e.MessageData, b.TypeNames[e.TypeId], e.SerializerId); err != nil {
				return err
			}
			s.p.handle(d)
		}
	}
}

// startPeer serves the peer's side with server TLS (nil: plaintext) and
// connects to to, the node's address, with client TLS.
func startPeer(t *testing.T, server, client *tls.Config, to string, handle func(delivery)) *peerNode {
	t.Helper()
	var opts []grpc.ServerOption
	if server != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(server)))
	}
	p := &peerNode{srv: grpc.NewServer(opts...), handle: handle, hang: make(chan struct{})}
	remote.RegisterRemotingServer(p.srv, peerServer{p: p})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.addr = lis.Addr().String()
	served := make(chan struct{})
	go func() { defer close(served); _ = p.srv.Serve(lis) }()
	t.Cleanup(func() { p.srv.Stop(); <-served })

	p.conn, p.out = dialStream(t, client, to)
	require.NoError(t, p.out.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{
		ConnectRequest: &remote.ConnectRequest{ConnectionType: &remote.ConnectRequest_ServerConnection{
			ServerConnection: &remote.ServerConnection{SystemId: "peer", Address: p.addr}}}}}))
	m, err := p.out.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetConnectResponse(), "connect response")
	return p
}

// stopHang makes the peer stop reading and answering, for good.
func (p *peerNode) stopHang() { p.hangOne.Do(func() { close(p.hang) }) }

func (p *peerNode) pid(id string) *actor.PID { return actor.NewPID(p.addr, id) }

// send delivers m to target, from sender (nil: none).
func (p *peerNode) send(target, sender *actor.PID, m proto.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Send(batchOf(target, sender, m))
}

// sendRaw sends a message as it is.
func (p *peerNode) sendRaw(m *remote.RemoteMessage) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Send(m)
}

func batchOf(target, sender *actor.PID, m proto.Message) *remote.RemoteMessage {
	data, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	// Copies: tests change a batch's PIDs, never the caller's.
	b := &remote.MessageBatch{
		TypeNames: []string{string(proto.MessageName(m))},
		Targets:   []*actor.PID{proto.Clone(target).(*actor.PID)},
		Envelopes: []*remote.MessageEnvelope{{MessageData: data}},
	}
	if sender != nil {
		b.Senders = []*actor.PID{proto.Clone(sender).(*actor.PID)}
		b.Envelopes[0].Sender = 1
	}
	return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}
}

// dialStream opens protoactor's Receive stream to addr as a raw gRPC
// client (client nil: plaintext); the connection closes with the test.
func dialStream(t *testing.T, client *tls.Config, addr string) (*grpc.ClientConn, remote.Remoting_ReceiveClient) {
	t.Helper()
	conn := dial(t, client, addr)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := remote.NewRemotingClient(conn).Receive(ctx)
	require.NoError(t, err)
	return conn, s
}

func dial(t *testing.T, client *tls.Config, addr string) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if client != nil {
		creds = credentials.NewTLS(client)
	}
	conn, err := grpc.Dial(addr, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
