package decode_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/messages/wire"
)

// strayEnv makes the test binary a node that asks the node at the address
// it names for an actor outside what a decode node serves (runStray).
const strayEnv = "KVSTREAM_DECODE_TEST_STRAY"

func init() {
	addr := os.Getenv(strayEnv)
	if addr == "" {
		return
	}
	if err := runStray(addr); err != nil {
		fmt.Fprintln(os.Stderr, "stray:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// strayTimeout is the stray request's own timeout: what its sender waited
// out when the node cut the stream instead of answering.
const strayTimeout = 20 * time.Second

// runStray asks, from a node of its own, the node at addr for the actor
// "kvstream-stray" (outside the "kvstream-decode" prefix the node serves)
// and prints how many milliseconds the answer took; it fails unless the
// answer is a dead letter.
func runStray(addr string) error {
	node, err := decode.Listen("127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer node.Close(ctx)
	start := time.Now()
	_, err = decode.RequestForTest(ctx, node, addr, "kvstream-stray", &wire.Bye{}, strayTimeout)
	took := time.Since(start)
	if !errors.Is(err, actor.ErrDeadLetter) {
		return fmt.Errorf("after %v: want a dead letter, got %v", took, err)
	}
	fmt.Println(took.Milliseconds())
	return nil
}

// observedNode is a node on 127.0.0.1 whose WARN lines the test reads.
func observedNode(t *testing.T) (*decode.Node, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.WarnLevel)
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0", Log: zap.New(core)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close(context.Background()) })
	return node, logs
}

// TestNodeAnswersARequestForAnActorItDoesNotServe: a peer node's request
// for an actor outside what the node serves fails at once, with a dead
// letter, and the node says so at WARN with the peer's address; it once
// cut the peer's stream, which fails no request: the sender waited out
// its 20 s timeout.
func TestNodeAnswersARequestForAnActorItDoesNotServe(t *testing.T) {
	node, logs := observedNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), strayTimeout+10*time.Second)
	defer cancel()
	stray := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	stray.Env = append(os.Environ(), strayEnv+"="+node.Addr())
	stray.Stderr = os.Stderr
	out, err := stray.Output()
	require.NoError(t, err, "the stray process failed (its stderr above)")
	ms, err := strconv.Atoi(strings.TrimSpace(string(out)))
	require.NoError(t, err, "the stray process printed %q", out)
	// No bound on the time here: the stray process already failed unless
	// the answer was a dead letter, which a request its sender waited out
	// (strayTimeout) is not, and a loaded machine may take long for either.
	t.Logf("answered in %d ms", ms)
	answered := logs.FilterMessage("netsec: answered a request for an actor this node does not serve").All()
	require.Len(t, answered, 1)
	f := answered[0].ContextMap()
	assert.Equal(t, "kvstream-stray", f["target"])
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, f["addr"], "the peer's address")
}

// rawCodec sends bytes as they are, whatever protobuf would make of them.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// TestNodeLogsAMalformedFrame: a frame that is not protobuf, sent on the
// node's message stream over a real gRPC connection, ends that stream and
// is logged at WARN with the address of the peer that sent it; nothing
// was logged before.
func TestNodeLogsAMalformedFrame(t *testing.T) {
	node, logs := observedNode(t)
	var mu sync.Mutex
	var local string
	conn, err := grpc.NewClient(node.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err == nil {
				mu.Lock()
				local = c.LocalAddr().String()
				mu.Unlock()
			}
			return c, err
		}))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{StreamName: "Receive", ServerStreams: true, ClientStreams: true},
		"/remote.Remoting/Receive", grpc.ForceCodec(rawCodec{}))
	require.NoError(t, err)
	require.NoError(t, s.SendMsg([]byte{0xff, 0xff, 0xff, 0xff}))
	var got []byte
	require.Error(t, s.RecvMsg(&got), "the node ends the stream")
	mu.Lock()
	peer := local
	mu.Unlock()
	require.NotEmpty(t, peer)
	require.Eventually(t, func() bool {
		for _, e := range logs.FilterMessage("netsec: a peer's message could not be read; its stream ended").All() {
			if e.Level == zap.WarnLevel && e.ContextMap()["addr"] == peer {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "a WARN naming %s; logged: %v", peer, logs.All())
}
