package netsec

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/kvstream/kvstream/lab/stallprobe"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// certs are the test's certificates: decode, prefill and intruder from the
// deployment's CA, and prefill again from a rogue CA.
type certs struct {
	decode, prefill, intruder, rogue *TLS
}

// makeCerts writes the test's certificates under dir (good/, rogue/) and
// loads them.
func makeCerts(dir string) (certs, error) {
	if _, err := GenerateDevCerts(filepath.Join(dir, "good"), []string{"decode", "prefill", "intruder"}, nil); err != nil {
		return certs{}, err
	}
	if _, err := GenerateDevCerts(filepath.Join(dir, "rogue"), []string{"prefill"}, nil); err != nil {
		return certs{}, err
	}
	return makeCertsFrom(dir)
}

// makeCertsFrom loads the certificates makeCerts wrote under dir.
func makeCertsFrom(dir string) (c certs, err error) {
	f := func(ca, node string) Files {
		d := filepath.Join(dir, ca)
		return Files{CA: filepath.Join(d, CAFile), Cert: filepath.Join(d, node+".pem"), Key: filepath.Join(d, node+".key")}
	}
	for _, l := range []struct {
		to *(*TLS)
		f  Files
	}{{&c.decode, f("good", "decode")}, {&c.prefill, f("good", "prefill")}, {&c.intruder, f("good", "intruder")}, {&c.rogue, f("rogue", "prefill")}} {
		if *l.to, err = LoadTLS(l.f); err != nil {
			return c, err
		}
	}
	return c, nil
}

// rogueClient trusts the deployment's CA (so the server's certificate
// verifies) but presents a certificate of another CA.
func rogueClient(c certs) *tls.Config {
	cfg := c.rogue.ClientConfig()
	cfg.RootCAs = c.decode.pool
	return cfg
}

// policy is the node's Authorize: the session's actors, bound to the
// peer named "prefill".
var policy = NewSessionPolicy(HeartbeatActor, HeartbeatMonitor, "session")

// fx is the one real protoactor remote node of this test binary (decode's
// certificate, the guards, policy, a heartbeat responder) on
// 127.0.0.1, which the tests below attack in file order and then show still
// serving: "still up" means this very node. It is one node for the whole
// binary because remote.Start sets grpc's global logger, which the
// goroutines of any node started earlier have read (a data race under
// -count > 1).
var fx struct {
	dir       string // the certificates' directory
	c         certs
	n         *node
	addr      string
	heartbeat *actor.PID
}

// withNode runs the tests with fx up, and stops it before goleak looks.
type withNode struct{ m *testing.M }

func (w withNode) Run() int {
	dir, err := os.MkdirTemp("", "netsec")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	fx.dir = dir
	if fx.c, err = makeCerts(dir); err != nil {
		panic(err)
	}
	if err := policy.Bind("prefill"); err != nil {
		panic(err)
	}
	fx.n, err = startNode(Options{TLS: fx.c.decode, Authorize: policy.Authorize})
	if err != nil {
		panic(err)
	}
	defer fx.n.stop()
	fx.addr = fx.n.system.Address()
	if _, err := ServeHeartbeats(fx.n.system); err != nil {
		panic(err)
	}
	fx.heartbeat = actor.NewPID(fx.addr, HeartbeatActor)
	return w.m.Run()
}

func listProcesses(t *testing.T, client *tls.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := remote.NewRemotingClient(dial(t, client, fx.addr)).ListProcesses(ctx, &remote.ListProcessesRequest{})
	return err
}

// An unauthenticated client never reaches a handler: the call fails at
// the transport (Unavailable), not with the handler's Unimplemented.
func TestRefusesPlaintextClient(t *testing.T) {
	require.Equal(t, codes.Unavailable, status.Code(listProcesses(t, nil)))
}

func TestRefusesClientOfAnotherCA(t *testing.T) {
	require.Equal(t, codes.Unavailable, status.Code(listProcesses(t, rogueClient(fx.c))))
}

func TestRefusesTLS12(t *testing.T) {
	cfg := fx.c.prefill.ClientConfig()
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	require.Equal(t, codes.Unavailable, status.Code(listProcesses(t, cfg)))
}

// protoactor's ListProcesses and GetProcessDiagnostics panic "implement
// me"; through the guard they answer Unimplemented and the node stays up.
func TestUnimplementedMethodsAnswerAnError(t *testing.T) {
	require.Equal(t, codes.Unimplemented, status.Code(listProcesses(t, fx.c.prefill.ClientConfig())))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := remote.NewRemotingClient(dial(t, fx.c.prefill.ClientConfig(), fx.addr)).
		GetProcessDiagnostics(ctx, &remote.GetProcessDiagnosticsRequest{})
	require.Equal(t, codes.Unimplemented, status.Code(err))
}

// Each batch goes on a fresh stream from an authenticated peer (a
// compromised or buggy one): the guard closes the stream with an error
// before protoactor indexes into the batch, which would panic (indexes),
// forward (a target not local) or dial an address of the peer's choosing
// (Terminated).
func TestRefusesMalformedBatches(t *testing.T) {
	valid := func() *remote.MessageBatch {
		return batchOf(fx.heartbeat, actor.NewPID("127.0.0.1:1", "x"), &Ping{Seq: 1}).GetMessageBatch()
	}
	with := func(change func(b *remote.MessageBatch)) *remote.MessageBatch {
		b := valid()
		change(b)
		return b
	}
	terminated := func(who *actor.PID) *remote.MessageBatch {
		return with(func(b *remote.MessageBatch) {
			b.TypeNames[0] = "actor.Terminated"
			b.Envelopes[0].MessageData, _ = proto.Marshal(&actor.Terminated{Who: who})
		})
	}
	_, port, err := net.SplitHostPort(fx.addr)
	require.NoError(t, err)
	cases := map[string]struct {
		batch *remote.MessageBatch
		code  codes.Code
	}{
		"target index past the end":     {with(func(b *remote.MessageBatch) { b.Envelopes[0].Target = 5 }), codes.InvalidArgument},
		"negative target index":         {with(func(b *remote.MessageBatch) { b.Envelopes[0].Target = -1 }), codes.InvalidArgument},
		"type index past the end":       {with(func(b *remote.MessageBatch) { b.Envelopes[0].TypeId = 3 }), codes.InvalidArgument},
		"sender index past the end":     {with(func(b *remote.MessageBatch) { b.Envelopes[0].Sender = 2 }), codes.InvalidArgument},
		"unknown type":                  {with(func(b *remote.MessageBatch) { b.TypeNames[0] = "no.Such" }), codes.InvalidArgument},
		"JSON serializer":               {with(func(b *remote.MessageBatch) { b.Envelopes[0].SerializerId = 1 }), codes.InvalidArgument},
		"serializer out of range":       {with(func(b *remote.MessageBatch) { b.Envelopes[0].SerializerId = 7 }), codes.InvalidArgument},
		"another spelling of this node": {with(func(b *remote.MessageBatch) { b.Targets[0].Address = "localhost:" + port }), codes.InvalidArgument},
		"Terminated without Who":        {terminated(nil), codes.InvalidArgument},
		"Terminated of another host":    {terminated(actor.NewPID("10.1.2.3:9100", "decode")), codes.PermissionDenied},
		"sender on another host":        {with(func(b *remote.MessageBatch) { b.Senders[0].Address = "10.1.2.3:9100" }), codes.PermissionDenied},
		"Watch by a watcher on another host": {with(func(b *remote.MessageBatch) {
			b.TypeNames[0] = "actor.Watch"
			b.Envelopes[0].MessageData, _ = proto.Marshal(&actor.Watch{Watcher: actor.NewPID("10.1.2.3:9100", "w")})
		}), codes.PermissionDenied},
		"Stop": {with(func(b *remote.MessageBatch) { b.TypeNames[0] = "actor.Stop"; b.Envelopes[0].MessageData = nil }), codes.PermissionDenied},
		// Never answered: the answer would go to a host of the peer's choosing.
		"a request for an actor not served, from another host": {with(func(b *remote.MessageBatch) {
			b.Targets[0].Id = "kvstream-not-served"
			b.Senders[0].Address = "10.1.2.3:9100"
		}), codes.PermissionDenied},
		// A request would be answered (TestAnswersARequestForAnActorNotServed).
		"a message to an actor not of the session": {with(func(b *remote.MessageBatch) {
			b.Targets[0].Id = "EndpointSupervisor"
			b.Senders, b.Envelopes[0].Sender = nil, 0
		}), codes.PermissionDenied},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, s := dialStream(t, fx.c.prefill.ClientConfig(), fx.addr)
			require.NoError(t, s.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: tc.batch}}))
			ended := make(chan error, 1)
			go func() { _, err := s.Recv(); ended <- err }() // ends at the test's cleanup at the latest
			select {
			case err := <-ended:
				require.Equal(t, tc.code, status.Code(err), "%v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the batch was not refused: the stream is still open")
			}
		})
	}
	require.Contains(t, guardLog.String(), `level=WARN msg="netsec: refused a message batch" peer=prefill addr=127.0.0.1:`)
}

// A batch over the receive limit ends its stream before it is decoded.
func TestRefusesOversizedBatch(t *testing.T) {
	b := batchOf(fx.heartbeat, nil, &Ping{Seq: 1})
	b.GetMessageBatch().Envelopes[0].MessageData = make([]byte, DefaultMaxMsgSize+1)
	_, s := dialStream(t, fx.c.prefill.ClientConfig(), fx.addr)
	require.NoError(t, s.Send(b))
	_, err := s.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
}

// A node whose certificate the CA signed, but that is not the session's
// peer, delivers nothing.
func TestRefusesAnotherAuthenticatedNode(t *testing.T) {
	_, s := dialStream(t, fx.c.intruder.ClientConfig(), fx.addr)
	require.NoError(t, s.Send(batchOf(fx.heartbeat, nil, &Ping{Seq: 1})))
	_, err := s.Recv()
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
}

// The same node, after every attack above, answers the session's peer: a
// Ping to its heartbeat actor comes back as a Pong over a connection the
// node dialled back to the peer with its own certificate.
func TestServesLegitimatePeer(t *testing.T) {
	pongs := make(chan *Pong, 1)
	p := startPeer(t, fx.c.prefill.ServerConfig(), fx.c.prefill.ClientConfig(), fx.addr, func(d delivery) {
		if pong, ok := d.msg.(*Pong); ok {
			pongs <- pong
		}
	})
	require.NoError(t, p.send(fx.heartbeat, p.pid("session"), &Ping{Seq: 42}))
	select {
	case pong := <-pongs:
		require.Equal(t, uint64(42), pong.Seq)
	case <-time.After(10 * time.Second):
		t.Fatal("no Pong from the node")
	}
}

// The actor that handles a peer's message learns who sent it from the
// guard, whatever the peer wrote in its headers.
func TestPeerNameReachesTheActor(t *testing.T) {
	_, err := fx.n.system.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*Ping); ok {
			ctx.Respond(wrapperspb.String(PeerName(ctx)))
		}
	}), "session")
	require.NoError(t, err)
	defer func() { _ = fx.n.system.Root.StopFuture(actor.NewPID(fx.addr, "session")).Wait() }()

	names := make(chan string, 1)
	p := startPeer(t, fx.c.prefill.ServerConfig(), fx.c.prefill.ClientConfig(), fx.addr, func(d delivery) {
		if s, ok := d.msg.(*wrapperspb.StringValue); ok {
			names <- s.Value
		}
	})
	forged := batchOf(actor.NewPID(fx.addr, "session"), p.pid("s"), &Ping{Seq: 1})
	forged.GetMessageBatch().Envelopes[0].MessageHeader = &remote.MessageHeader{HeaderData: map[string]string{PeerHeader: "decode"}}
	require.NoError(t, p.sendRaw(forged))
	select {
	case name := <-names:
		require.Equal(t, "prefill", name)
	case <-time.After(10 * time.Second):
		t.Fatal("no answer from the session actor")
	}
}

// The node's monitor pings a peer that answers, then stops reading and
// answering (as a SIGSTOPped process: its connections stay open).
func TestHeartbeatsFindHungPeer(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 50 * time.Millisecond, Misses: 4}
	var answered atomic.Int64
	healthy := make(chan struct{})
	var p *peerNode
	p = startPeer(t, fx.c.prefill.ServerConfig(), fx.c.prefill.ClientConfig(), fx.addr, func(d delivery) {
		ping, ok := d.msg.(*Ping)
		if !ok || d.sender == nil {
			return
		}
		// Seq 0 is the round trip below; the monitor's pings count from 1.
		if p.send(d.sender, nil, &Pong{Seq: ping.Seq}) == nil && ping.Seq > 0 && answered.Add(1) == int64(3*cfg.Misses) {
			close(healthy)
		}
	})
	// One round trip first, as TestHeartbeatsFindStoppedProcess does: the
	// node dials the peer (a TLS handshake, tens of ms of CPU under -race)
	// before the monitor's 200 ms of silence start counting. A monitor
	// started on a session still connecting declared the healthy peer lost
	// when a starved process took longer than that to connect.
	res, err := fx.n.system.Root.RequestFuture(p.pid(HeartbeatActor), &Ping{Seq: 0}, 10*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, uint64(0), res.(*Pong).Seq)
	lost := make(chan error, 1)
	m, err := WatchHeartbeats(fx.n.system, p.pid(HeartbeatActor), cfg, func(err error) { lost <- err })
	require.NoError(t, err)
	defer m.Stop()

	// Three times the miss budget of answered pings, and not lost.
	select {
	case <-healthy:
	case err := <-lost:
		t.Fatalf("healthy peer declared lost: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the peer was never pinged")
	}
	select {
	case err := <-lost:
		t.Fatalf("healthy peer declared lost: %v", err)
	default:
	}

	probe := stallprobe.Start()
	defer probe.Close()
	p.stopHang()
	hung := time.Now()
	select {
	case err := <-lost:
		took := time.Since(hung)
		require.ErrorIs(t, err, ErrPeerLost)
		// The bound, plus scheduling slack on a shared 2-core machine, plus
		// however long this process was stalled: a starved monitor takes
		// its ticks, and so declares the loss, that much later.
		if over := took - (cfg.Bound() + 500*time.Millisecond); over > 0 {
			st := probe.Stalled(hung, hung.Add(took))
			require.GreaterOrEqual(t, st, over, "declared lost %v after the peer hung (bound %v), later by more than the process was stalled (%v)", took, cfg.Bound(), st)
		}
		t.Logf("hung peer declared lost after %v (bound %v): %v", took.Round(time.Millisecond), cfg.Bound(), err)
	case <-time.After(10 * time.Second):
		t.Fatal("hung peer never declared lost")
	}
}

// A request of the session's peer for an actor the node does not serve
// is answered at once with a dead letter (what the peer's future fails
// with), as one for an actor that does not exist would be, and logged;
// the stream stays open and the peer's next message is served. The guard
// once cut the stream, which fails no future: the requester waited out
// its timeout.
func TestAnswersARequestForAnActorNotServed(t *testing.T) {
	answers := make(chan delivery, 4)
	p := startPeer(t, fx.c.prefill.ServerConfig(), fx.c.prefill.ClientConfig(), fx.addr, func(d delivery) { answers <- d })
	asked := time.Now()
	require.NoError(t, p.send(actor.NewPID(fx.addr, "kvstream-not-served"), p.pid("future$7"), &Ping{Seq: 1}))
	select {
	case d := <-answers:
		require.IsType(t, &actor.DeadLetterResponse{}, d.msg)
		require.Equal(t, "future$7", d.target.Id, "the requester's future")
		require.Equal(t, "kvstream-not-served", d.msg.(*actor.DeadLetterResponse).Target.GetId())
		t.Logf("answered %v after the request", time.Since(asked).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to a request for an actor the node does not serve")
	}
	require.NoError(t, p.send(fx.heartbeat, p.pid("session"), &Ping{Seq: 2}))
	select {
	case d := <-answers:
		pong, ok := d.msg.(*Pong)
		require.True(t, ok, "the same stream still serves: got %T", d.msg)
		require.Equal(t, uint64(2), pong.Seq)
	case <-time.After(10 * time.Second):
		t.Fatal("no Pong after the answered request: the stream was cut")
	}
	require.Contains(t, guardLog.String(), `level=WARN msg="netsec: answered a request for an actor this node does not serve" peer=prefill addr=127.0.0.1:`)
}

// rawCodec sends bytes as they are, whatever protobuf would make of them.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// A message the node cannot read ends its stream and is logged at WARN
// with the peer's name and address: bytes that are no protoactor message,
// and a batch whose message does not decode as its type. protoactor
// reported both only to its own (quiet) logger.
func TestLogsUnreadableMessages(t *testing.T) {
	garbage := batchOf(fx.heartbeat, nil, &Ping{Seq: 1})
	garbage.GetMessageBatch().Envelopes[0].MessageData = []byte{0xff, 0xff, 0xff}
	wire, err := proto.Marshal(garbage)
	require.NoError(t, err)
	for name, frame := range map[string][]byte{
		"not a protoactor message":      {0xff, 0xff, 0xff, 0xff},
		"a message that does not parse": wire,
	} {
		t.Run(name, func(t *testing.T) {
			before := strings.Count(guardLog.String(), "netsec: a peer's message could not be read")
			conn := dial(t, fx.c.prefill.ClientConfig(), fx.addr)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := conn.NewStream(ctx, &grpc.StreamDesc{StreamName: "Receive", ServerStreams: true, ClientStreams: true},
				"/remote.Remoting/Receive", grpc.ForceCodec(rawCodec{}))
			require.NoError(t, err)
			require.NoError(t, s.SendMsg(frame))
			var got []byte
			require.Error(t, s.RecvMsg(&got), "the stream ends")
			require.Eventually(t, func() bool {
				return strings.Count(guardLog.String(), "netsec: a peer's message could not be read") > before
			}, 10*time.Second, 10*time.Millisecond)
			require.Regexp(t, `level=WARN msg="netsec: a peer's message could not be read; its stream ended" peer=prefill addr=127\.0\.0\.1:\d+`, guardLog.String())
		})
	}
}
