//go:build ucx

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/kvstream/kvstream/netsec"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// devCerts writes a CA and certificates for decode, prefill and a rogue
// node of the same CA (a compromised member of the deployment); every
// certificate also names 127.0.0.2.
func devCerts(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	c := startCLI(t, nil, "certs", dir, "--nodes", "decode,prefill,rogue", "--hosts", "127.0.0.2")
	require.NoError(t, c.wait(t, 30*time.Second), "certs:\n%s\n%s", c.out(), c.errOut())
	return dir
}

// small is a short prefill run of the small model (3 requests, 8 chunks).
var small = []string{"--model", "small", "--requests", "3", "--prompt-tokens", "2000", "--chunk-tokens", "1024", "--page-size", "16", "--group", "4"}

func requireServed(t *testing.T, dec, pre *cli) {
	t.Helper()
	require.NoError(t, pre.wait(t, 2*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	require.NoError(t, dec.wait(t, 30*time.Second), "decode:\n%s\n%s", dec.out(), dec.errOut())
	assert.Contains(t, pre.out(), "bytes equal: true")
	assert.Regexp(t, `decode: served 1 sessions \(1 complete\): 8 chunks \(0 not successful\), 3 rooms complete, 3375 pages verified, bytes equal: true`, dec.out())
}

// wildcardListeners lists the TCP sockets of process pid that listen on
// every interface (0.0.0.0 or ::), from /proc.
func wildcardListeners(t *testing.T, pid int) []string {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var wild []string
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// sl local rem st ... inode (field 9); state 0A is LISTEN.
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] {
				continue
			}
			if host, _, _ := strings.Cut(fields[1], ":"); strings.Trim(host, "0") == "" {
				wild = append(wild, table+" "+fields[1])
			}
		}
		f.Close()
	}
	return wild
}

// TestUCXTwoAddresses runs decode and prefill on two different loopback
// addresses (127.0.0.2 and 127.0.0.1), as on two hosts: mutual TLS on the
// control plane, the KV over UCX tcp, and the decode process listening on
// no wildcard address (its control plane on 127.0.0.2, UCX on lo only).
func TestUCXTwoAddresses(t *testing.T) {
	t.Parallel()
	dir := devCerts(t)
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.2:0", "--tls-dir", dir, "--prefill-name", "prefill", "--sessions", "1", "--wait", "2m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	require.True(t, strings.HasPrefix(addr, "127.0.0.2:"), addr)
	pre := startCLI(t, env, append([]string{"prefill", "--decode", addr, "--listen", "127.0.0.1:0", "--tls-dir", dir}, small...)...)
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 1/\d+ done`), time.Minute)
	assert.Empty(t, wildcardListeners(t, dec.cmd.Process.Pid), "the decode process listens on every interface")
	requireServed(t, dec, pre)
}

// TestUCXAllInterfaces is the documented two-machine setup on one host:
// both nodes listen on 0.0.0.0 with mutual TLS and advertise the host's
// routable address (never [::]), which the certificates name; UCX uses
// that address's interface.
func TestUCXAllInterfaces(t *testing.T) {
	t.Parallel()
	ip, err := decode.RoutableIP()
	if err != nil {
		t.Skipf("no routable interface on this host: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "certs")
	certs := startCLI(t, nil, "certs", dir, "--hosts", ip.String())
	require.NoError(t, certs.wait(t, 30*time.Second), "certs:\n%s\n%s", certs.out(), certs.errOut())
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "0.0.0.0:0", "--tls-dir", dir, "--sessions", "1", "--wait", "2m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	require.True(t, strings.HasPrefix(addr, ip.String()+":"), "advertised %s, want the routable %s", addr, ip)
	pre := startCLI(t, env, append([]string{"prefill", "--decode", addr, "--listen", "0.0.0.0:0", "--tls-dir", dir}, small...)...)
	requireServed(t, dec, pre)
}

// TestUCXHungDecodeIsLost SIGSTOPs the decode process mid-run: the prefill
// declares it lost by heartbeats within --heartbeat (not the finish
// timeout of a minute), fails its chunks and exits non-zero promptly.
func TestUCXHungDecodeIsLost(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	pre := startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "4",
		"--prompt-tokens", "8192", "--chunk-tokens", "1024", "--page-size", "16", "--layer-us-per-ktok", "5000",
		"--finish-timeout", "1m", "--heartbeat", "2s")
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 2/\d+ done`), time.Minute)
	require.NoError(t, dec.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	t.Cleanup(func() { _ = dec.cmd.Process.Signal(syscall.SIGCONT) })
	err := pre.wait(t, time.Minute)
	took := time.Since(stopped)
	require.Error(t, err, "the prefill must not report success")
	assert.Less(t, took, 15*time.Second, "declared lost by heartbeats (2 s), and exit adds no tens of seconds")
	assert.Contains(t, pre.out(), "decode lost")
	assert.Contains(t, pre.out(), "no heartbeat answer")
	assert.Contains(t, pre.out(), "bytes equal: not compared for every chunk (none compared differed)", "a lost decode compared nothing more: no byte differed")
}

// TestUCXHungPrefillIsLost SIGSTOPs the prefill process mid-run: the decode
// declares it lost by heartbeats within --heartbeat, reports the session
// not complete and exits non-zero promptly.
func TestUCXHungPrefillIsLost(t *testing.T) {
	t.Parallel()
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m", "--heartbeat", "2s",
		"--metrics-addr", "127.0.0.1:0")
	// Each line is waited for on its own stream: lines of stdout and
	// stderr reach the lines channel in either order.
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	serving := regexp.MustCompile(`serving metrics at http://(\S+)/metrics`)
	require.Eventually(t, func() bool { return serving.MatchString(dec.errOut()) }, 30*time.Second, 10*time.Millisecond, "stderr: %s", dec.errOut())
	ops := serving.FindStringSubmatch(dec.errOut())[1]
	pre := startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "8",
		"--prompt-tokens", "8192", "--chunk-tokens", "1024", "--page-size", "16", "--layer-us-per-ktok", "5000")
	// Stopped once the decode verified a chunk: a session that did
	// something, which --sessions 1 counts.
	verified := regexp.MustCompile(`kvstream_decode_verified_bytes_total [1-9]`)
	for end := time.Now().Add(time.Minute); ; {
		body, err := scrape(ops)
		require.NoError(t, err)
		if verified.MatchString(body) {
			break
		}
		require.True(t, time.Now().Before(end), "the decode verified nothing within a minute:\n%s", pre.errOut())
	}
	require.NoError(t, pre.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	t.Cleanup(func() { _ = pre.cmd.Process.Signal(syscall.SIGCONT) })
	err := dec.wait(t, time.Minute)
	took := time.Since(stopped)
	require.Error(t, err, "the decode must not report success")
	assert.Less(t, took, 15*time.Second, "declared lost by heartbeats (2 s), and exit adds no tens of seconds")
	assert.Contains(t, dec.out(), "ended lost", "stderr:\n%s", dec.errOut())
	assert.Contains(t, dec.out(), "no heartbeat answer")
}

// attacker speaks protoactor remote's wire protocol to a node, and nothing
// else: raw gRPC.
type attacker struct {
	t    *testing.T
	addr string
	tls  *tls.Config // nil: plaintext
}

func (a attacker) conn() *grpc.ClientConn {
	creds := insecure.NewCredentials()
	if a.tls != nil {
		creds = credentials.NewTLS(a.tls)
	}
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(creds))
	require.NoError(a.t, err)
	return conn
}

// send sends one batch on a fresh stream, then a probe on the same stream,
// and returns how the stream ended (nil: the node took the batch and kept
// the stream open). The probe is a second ConnectRequest, which protoactor
// answers on the stream with a ConnectResponse; the node reads a stream's
// messages in order, so the probe's answer comes only once the batch was
// taken, and a refusal cuts the stream before it. Neither a late refusal
// nor a slow cut is mistaken for the other outcome, as a fixed wait would.
func (a attacker) send(b *remote.MessageBatch) error {
	conn := a.conn()
	defer conn.Close()
	// Only a node that neither answers nor cuts the stream meets this
	// bound: that fails the test, whatever the attack's expected outcome.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := remote.NewRemotingClient(conn).Receive(ctx)
	if err != nil {
		return err
	}
	connect := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "rogue", Address: "127.0.0.1:1"}}}}}
	for _, m := range []*remote.RemoteMessage{connect, {MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}, connect} {
		// io.EOF: the node already ended the stream; Recv says how.
		if err := s.Send(m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return err
		}
	}
	// One ConnectResponse answers the first ConnectRequest, a second the
	// probe.
	for answers := 0; answers < 2; {
		m, err := s.Recv()
		if ctx.Err() != nil {
			a.t.Fatalf("the node neither answered the probe nor ended the stream within a minute (last: %v)", err)
		}
		if err != nil {
			return err // io.EOF too: the stream ended without the probe's answer
		}
		if m.GetConnectResponse() != nil {
			answers++
		}
	}
	return nil
}

func batch(target, sender *actor.PID, m proto.Message) *remote.MessageBatch {
	data, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	b := &remote.MessageBatch{TypeNames: []string{string(proto.MessageName(m))}, Targets: []*actor.PID{target},
		Envelopes: []*remote.MessageEnvelope{{MessageData: data}}}
	if sender != nil {
		b.Senders = []*actor.PID{sender}
		b.Envelopes[0].Sender = 1
	}
	return b
}

// TestUCXAttacksThenServes attacks a decode process with mutual TLS the way
// issue 15 did, before and during a session, from a node of the same CA
// that is not its prefill and without a certificate: every attack is
// refused, and the process then serves its prefill byte-equal.
func TestUCXAttacksThenServes(t *testing.T) {
	t.Parallel()
	dir := devCerts(t)
	rogueTLS, err := netsec.LoadTLS(netsec.Files{CA: filepath.Join(dir, netsec.CAFile), Cert: filepath.Join(dir, "rogue.pem"), Key: filepath.Join(dir, "rogue.key")})
	require.NoError(t, err)
	env := []string{"UCX_TLS=tcp"}
	// A service (no --sessions): the node stays up for the attacks
	// however soon the session ends.
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--tls-dir", dir, "--prefill-name", "prefill", "--wait", "2m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	rogue := attacker{t: t, addr: addr, tls: rogueTLS.ClientConfig()}
	_, port, _ := strings.Cut(addr, ":")
	server := actor.NewPID(addr, decode.ServerActor)
	rogueSender := actor.NewPID("127.0.0.1:1", "rogue")
	prefillSession := actor.NewPID("127.0.0.1:2", "kvstream-prefill-1")

	sessionOnly := map[string]bool{"spoofed Terminated": true, "spoofed goodbye": true, "spoofed notice": true, "hello of another node": true}
	attack := func(phase string) {
		// No certificate: the handshake fails, no handler runs.
		conn := attacker{t: t, addr: addr}.conn()
		_, err := remote.NewRemotingClient(conn).ListProcesses(context.Background(), &remote.ListProcessesRequest{})
		conn.Close()
		require.Error(t, err, phase)
		// The methods that panicked answer an error.
		conn = rogue.conn()
		_, err = remote.NewRemotingClient(conn).ListProcesses(context.Background(), &remote.ListProcessesRequest{})
		require.Equal(t, codes.Unimplemented, status.Code(err), "%s: %v", phase, err)
		_, err = remote.NewRemotingClient(conn).GetProcessDiagnostics(context.Background(), &remote.GetProcessDiagnosticsRequest{Pid: server})
		require.Equal(t, codes.Unimplemented, status.Code(err), "%s: %v", phase, err)
		conn.Close()
		for name, b := range map[string]*remote.MessageBatch{
			"target index out of range": {TypeNames: []string{"actor.Terminated"}, Targets: []*actor.PID{server}, Envelopes: []*remote.MessageEnvelope{{Target: 7}}},
			"type index out of range":   {TypeNames: []string{"actor.Terminated"}, Targets: []*actor.PID{server}, Envelopes: []*remote.MessageEnvelope{{TypeId: 9}}},
			"spoofed Terminated":        batch(server, rogueSender, &actor.Terminated{Who: prefillSession}),
			"Stop":                      batch(server, rogueSender, &actor.Stop{}),
			"spoofed goodbye":           batch(server, prefillSession, &wire.Bye{Session: "guess", Chunks: 1}),
			"spoofed notice":            batch(server, prefillSession, &wire.ChunkNotice{Session: "guess", Room: 1, End: 1, Last: true}),
			"own address spelled again": batch(actor.NewPID("localhost:"+port, decode.ServerActor), rogueSender, &wire.Bye{}),
			"hello of another node":     batch(server, rogueSender, &wire.Hello{Version: decode.ProtocolVersion, SessionAddress: "127.0.0.1:1", SessionId: "rogue", Buffers: []*wire.Buffer{{ItemLen: 1 << 62, Pages: 1 << 62}}}),
			"endpoint manager":          batch(actor.NewPID(addr, "EndpointSupervisor"), rogueSender, &actor.Stop{}),
		} {
			err := rogue.send(b)
			if sessionOnly[name] {
				// The server's actor is open to every node of the CA (it
				// answers every Hello, a refusal included, rather than let
				// the stream be cut and the peer time out): these reach it,
				// and it refuses them itself (a Terminated is a suspicion
				// the heartbeats settle, an unknown token is refused, a
				// Hello of a peer not in --prefill-name is answered with
				// the reason). The session below goes on, byte-equal.
				require.NoError(t, err, "%s: %s: the node cut the stream of a message its server answers", phase, name)
				continue
			}
			require.Error(t, err, "%s: %s was not refused", phase, name)
		}
	}
	attack("before the session")
	// Slow layers (160 ms a forward): the session lasts through the attacks.
	pre := startCLI(t, env, append(append([]string{"prefill", "--decode", addr, "--tls-dir", dir}, small...), "--layer-us-per-ktok", "20000")...)
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 1/\d+ done`), time.Minute)
	attack("during the session")
	require.NoError(t, pre.wait(t, 2*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	require.NoError(t, dec.cmd.Process.Signal(syscall.SIGTERM))
	requireServed(t, dec, pre)
}
