package decode_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cluster/etcdproc"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/stallprobe"
	"github.com/kvstream/kvstream/netsec"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
)

// roleEnv makes the test binary one side of a session: "decode", or
// "prefill ADDR" (says Bye), or "vanish ADDR" (exits without Bye). Each
// side is its own process, as in production. No byte moves here (the
// loopback fabric does not cross processes): this is the control plane.
const roleEnv = "KVSTREAM_DECODE_TEST_ROLE"

func init() {
	role := os.Getenv(roleEnv)
	if role == "" {
		return
	}
	var err error
	// "decode [CERTDIR]", or "prefill|vanish ADDR [CERTDIR NODE]".
	f := append(strings.Fields(role), "", "", "")
	switch f[0] {
	case "decode":
		err = runDecodeRole(f[1])
	case "cancel-decode":
		err = runCancelDecodeRole()
	case "cancel-prefill":
		err = runCancelPrefillRole(f[1])
	case "long-cancel-decode":
		err = runLongCancelDecodeRole()
	case "long-cancel-prefill":
		err = runLongCancelPrefillRole(f[1])
	case "bytes-decode":
		err = runBytesDecodeRole()
	case "bytes-prefill":
		err = runBytesPrefillRole(f[1])
	default:
		err = runPrefillRole(f[1], f[0] == "vanish", f[2], f[3])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, role+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// nodeConfig is a test node on 127.0.0.1, with the TLS material of node
// from dir when dir is set.
func nodeConfig(dir, node string) (decode.NodeConfig, error) {
	cfg := decode.NodeConfig{Listen: "127.0.0.1:0"}
	if dir == "" {
		return cfg, nil
	}
	var err error
	cfg.TLS, err = netsec.LoadTLS(netsec.Files{CA: filepath.Join(dir, netsec.CAFile), Cert: filepath.Join(dir, node+".pem"), Key: filepath.Join(dir, node+".key")})
	return cfg, err
}

// runDecodeRole serves one session and prints how it ended: "complete" or
// the error's class. With TLS (certificates in dir) it serves only the
// prefill named "prefill".
func runDecodeRole(dir string) error {
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	if err != nil {
		return err
	}
	defer tr.Close()
	pool, err := hostmem.Alloc(buffers * itemLen * pages)
	if err != nil {
		return err
	}
	defer pool.Free()
	cfg, err := nodeConfig(dir, "decode")
	if err != nil {
		return err
	}
	node, err := decode.ListenConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer node.Close(ctx)
	var prefills []string
	if dir != "" {
		prefills = []string{"prefill"}
	}
	// Only the prefill leaving may end the session: a grace period that
	// ended it instead would hide a lost Terminated.
	srv, err := decode.New(node, tr, decode.Config{Buffers: decodeBuffers(pool), ByeGrace: time.Hour, Prefills: prefills})
	if err != nil {
		return err
	}
	defer srv.Close(ctx)
	if err := srv.Expect(1, []int{0, 1, 2, 3}); err != nil {
		return err
	}
	fmt.Println(node.Addr())
	ss, err := srv.Accept(ctx)
	if err != nil {
		return err
	}
	rep, err := ss.Wait(ctx)
	_, roomErr := srv.Wait(ctx, 1)
	switch {
	case err == nil && rep.Complete && roomErr == nil:
		fmt.Println("session complete")
	case errors.Is(err, decode.ErrPrefillLost) && errors.Is(roomErr, decode.ErrPrefillLost) && !rep.Complete:
		fmt.Println("prefill lost")
	default:
		return fmt.Errorf("session: %+v, %v; room: %v", rep, err, roomErr)
	}
	return nil
}

// runPrefillRole opens a session with the decode at addr, as the node
// named name of the certificates in dir when dir is set. A session the
// decode refuses prints "refused".
func runPrefillRole(addr string, vanish bool, dir, name string) error {
	cfg, err := nodeConfig(dir, name)
	if err != nil {
		return err
	}
	node, err := decode.ListenConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := decode.Dial(ctx, node, decode.DialConfig{Decode: addr, Buffers: prefillLayout(itemLen), PageSize: 4})
	if errors.Is(err, decode.ErrRefused) {
		fmt.Println("refused")
		return node.Close(ctx)
	}
	if err != nil {
		return err
	}
	n := notice(1, 0, 2, 0, false, system.Succeeded, nil)
	if err := c.Notify(ctx, n); err != nil {
		return err
	}
	if vanish {
		os.Exit(0) // no Bye, no stop: the process is gone
	}
	if err := c.Notify(ctx, notice(1, 2, 4, 0, true, system.Succeeded, nil)); err != nil {
		return err
	}
	if _, err := c.Bye(ctx, nil); err != nil {
		return fmt.Errorf("bye: the decode server's answer: %w", err)
	}
	return node.Close(ctx)
}

// TestSessionAcrossProcesses ends a session the way a two-process run ends
// (Bye, the decode server's answer, both nodes stopping), then the way a
// crashed prefill does (its process exits mid-room): the decode side
// reports the session complete, then the room and the session lost. Neither
// node's stop may race with its connection goroutines noticing the other go
// (a race report makes the child exit non-zero).
func TestSessionAcrossProcesses(t *testing.T) {
	for _, tc := range []struct{ prefill, want string }{
		{"prefill", "session complete"},
		{"vanish", "prefill lost"},
	} {
		t.Run(tc.prefill, func(t *testing.T) {
			dec, addr, lines := startDecodeRole(t, "decode")

			runPrefillProcess(t, tc.prefill+" "+addr)
			verdict, err := lines.ReadString('\n')
			require.NoError(t, err, "the decode process printed no verdict (its stderr above)")
			require.Equal(t, tc.want, strings.TrimSpace(verdict))
			require.NoError(t, dec.Wait(), "the decode process did not end cleanly (its stderr above)")
		})
	}
}

// TestTLSSessionAcrossProcesses runs the control plane with mutual TLS
// across processes: a node of the same CA that is not a prefill the decode
// serves is refused before anything is offered, and then the prefill's
// session completes; every message of it went through the session bound to
// the prefill's certificate.
func TestTLSSessionAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	_, err := netsec.GenerateDevCerts(dir, []string{"decode", "prefill", "rogue"}, nil)
	require.NoError(t, err)
	dec := exec.Command(os.Args[0], "-test.run=^$")
	dec.Env = append(os.Environ(), roleEnv+"=decode "+dir)
	dec.Stderr = os.Stderr
	out, err := dec.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, dec.Start())
	t.Cleanup(func() { _ = dec.Process.Kill() })
	lines := bufio.NewReader(out)
	addr, err := lines.ReadString('\n')
	require.NoError(t, err, "the decode process printed no address")
	addr = strings.TrimSpace(addr)

	rogue := exec.Command(os.Args[0], "-test.run=^$")
	rogue.Env = append(os.Environ(), roleEnv+"=prefill "+addr+" "+dir+" rogue")
	rogue.Stderr = os.Stderr
	said, err := rogue.Output()
	require.NoError(t, err, "the rogue process failed (its stderr above)")
	require.Equal(t, "refused", strings.TrimSpace(string(said)))

	pre := exec.Command(os.Args[0], "-test.run=^$")
	pre.Env = append(os.Environ(), roleEnv+"=prefill "+addr+" "+dir+" prefill")
	pre.Stdout, pre.Stderr = os.Stderr, os.Stderr
	require.NoError(t, pre.Run(), "the prefill process failed (its stderr above)")
	verdict, err := lines.ReadString('\n')
	require.NoError(t, err, "the decode process printed no verdict (its stderr above)")
	require.Equal(t, "session complete", strings.TrimSpace(verdict))
	require.NoError(t, dec.Wait(), "the decode process did not end cleanly (its stderr above)")
}

// TestHeartbeatsFindStoppedDecode SIGSTOPs a decode process during a
// session: its connections stay open, so only the heartbeats can tell, and
// the prefill's client reports it lost (ErrDecodeLost) within the bound,
// plus 2 s of scheduling, plus however long this process was stalled (its
// heartbeat ticks came that late: a loaded machine, not a fault).
func TestHeartbeatsFindStoppedDecode(t *testing.T) {
	dec, addr, _ := startDecodeRole(t, "decode")

	hb := decode.HeartbeatWithin(1400 * time.Millisecond)
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0", Heartbeat: hb})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	defer func() { require.NoError(t, node.Close(ctx)) }()
	c, err := decode.Dial(ctx, node, decode.DialConfig{Decode: addr, Buffers: prefillLayout(itemLen), PageSize: 4})
	require.NoError(t, err)
	lost := make(chan error, 1)
	c.OnLost(func(err error) { lost <- err })

	probe := stallprobe.Start()
	defer probe.Close()
	stopDecode(t, dec)
	stopped := time.Now()
	limit := hb.Bound() + 2*time.Second
	// within fails the test if the wait so far overran limit by more than
	// the process was stalled meanwhile.
	within := func(waited time.Duration, what string) {
		if over := waited - limit; over > 0 {
			st := probe.Stalled(stopped, stopped.Add(waited))
			require.GreaterOrEqual(t, st, over, "%s %v after SIGSTOP (bound %v), later by more than this process was stalled (%v)", what, waited, hb.Bound(), st)
		}
	}
	for declared := false; !declared; {
		select {
		case err := <-lost:
			took := time.Since(stopped)
			declared = true
			require.True(t, errors.Is(err, decode.ErrDecodeLost), "%v", err)
			require.ErrorContains(t, err, "no heartbeat answer")
			within(took, "declared lost")
			t.Logf("stopped decode process declared lost after %v (bound %v)", took.Round(time.Millisecond), hb.Bound())
		case <-time.After(10 * time.Second):
			within(time.Since(stopped), "not declared lost")
		}
	}
	_, err = c.Bye(ctx, nil)
	require.True(t, errors.Is(err, decode.ErrDecodeLost), "%v", err)
}

// roleServer is what a decode role serves: a server on a loopback
// transport with room 1 expected, its node's address printed, and one
// session accepted.
type roleServer struct {
	srv  *decode.Server
	ss   *decode.Session
	stop func() // frees what it holds, in order
}

// startRoleServer starts a roleServer whose chunks verify checks.
func startRoleServer(ctx context.Context, verify func(*decode.Session, decode.Chunk) error) (*roleServer, error) {
	var undo []func()
	stop := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	fail := func(err error) (*roleServer, error) {
		stop()
		return nil, err
	}
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = tr.Close() })
	pool, err := hostmem.Alloc(buffers * itemLen * pages)
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = pool.Free() })
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = node.Close(ctx) })
	srv, err := decode.New(node, tr, decode.Config{Buffers: decodeBuffers(pool), ByeGrace: time.Hour, Verify: verify})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = srv.Close(ctx) })
	if err := srv.Expect(1, []int{0, 1, 2, 3}); err != nil {
		return fail(err)
	}
	fmt.Println(node.Addr())
	ss, err := srv.Accept(ctx)
	if err != nil {
		return fail(err)
	}
	return &roleServer{srv: srv, ss: ss, stop: stop}, nil
}

// startCancelRole is the roleServer of a role that cancels room 1: it
// returns once the prefill reported its first chunk.
func startCancelRole(ctx context.Context) (*roleServer, error) {
	first := make(chan struct{}, 1)
	r, err := startRoleServer(ctx, func(*decode.Session, decode.Chunk) error {
		select {
		case first <- struct{}{}:
		default:
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	<-first
	return r, nil
}

// runCancelDecodeRole serves one session, cancels its room once the
// prefill reported its first chunk (as a scheduler giving up does), and
// prints what followed: the cancel returned only once the prefill answered,
// the pages went to another room, the session ended complete.
func runCancelDecodeRole() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := startCancelRole(ctx)
	if err != nil {
		return err
	}
	defer r.stop()
	srv, ss := r.srv, r.ss
	start := time.Now()
	if err := srv.Cancel(ctx, 1, "the scheduler gave up"); err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	fmt.Fprintf(os.Stderr, "cancel-decode: Server.Cancel took %v across processes (call to pages freed)\n", time.Since(start))
	if err := srv.Expect(2, []int{0, 1, 2, 3}); err != nil {
		return fmt.Errorf("the cancelled room's pages are not free: %w", err)
	}
	rep, err := ss.Wait(ctx)
	if err != nil || !rep.Complete {
		return fmt.Errorf("session: %+v, %v", rep, err)
	}
	fmt.Println("room cancelled, pages free, session complete")
	return nil
}

// dialRole is how a prefill role starts: a node of its own, and a
// session with the decode at addr.
func dialRole(ctx context.Context, addr string) (*decode.Node, *decode.Client, error) {
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		return nil, nil, err
	}
	c, err := decode.Dial(ctx, node, decode.DialConfig{Decode: addr, Buffers: prefillLayout(itemLen), PageSize: 4})
	if err != nil {
		_ = node.Close(ctx)
		return nil, nil, err
	}
	return node, c, nil
}

// runCancelPrefillRole reports room 1's first chunk to the decode at addr,
// hears its cancel, drops the room (here: nothing in flight), answers, and
// says goodbye.
func runCancelPrefillRole(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, c, err := dialRole(ctx, addr)
	if err != nil {
		return err
	}
	cancelled := make(chan uint64, 1)
	c.OnCancel(func(room uint64, _ string) { cancelled <- room })
	if err := c.Notify(ctx, notice(1, 0, 2, 0, false, system.Succeeded, nil)); err != nil {
		return err
	}
	var room uint64
	select {
	case room = <-cancelled:
	case <-ctx.Done():
		return errors.New("the decode's cancel never came")
	}
	// The engine's Drop of the room would return here.
	if err := c.Cancel(ctx, room, "dropped", nil); err != nil {
		return fmt.Errorf("answer the cancel: %w", err)
	}
	if _, err := c.Bye(ctx, nil); err != nil {
		return fmt.Errorf("bye: %w", err)
	}
	return node.Close(ctx)
}

// TestCancelAcrossProcesses: the decode process cancels a room mid-way;
// the prefill process hears it, answers once its writes stopped, and says
// goodbye; the decode's Cancel returned only then, the pages went to
// another room, and the session is complete (a cancel is no failure of
// the prefill's).
func TestCancelAcrossProcesses(t *testing.T) {
	runRoles(t, "cancel-decode", "cancel-prefill", "room cancelled, pages free, session complete")
}

// runRoles runs this test binary as a decode process in role decodeRole
// and, against it, as a prefill process in role prefillRole, and checks
// the decode's verdict and clean end.
func runRoles(t *testing.T, decodeRole, prefillRole, verdict string) {
	t.Helper()
	dec, addr, lines := startDecodeRole(t, decodeRole)
	runPrefillProcess(t, prefillRole+" "+addr)
	got, err := lines.ReadString('\n')
	require.NoError(t, err, "the decode process printed no verdict (its stderr above)")
	require.Equal(t, verdict, strings.TrimSpace(got))
	require.NoError(t, dec.Wait(), "the decode process did not end cleanly (its stderr above)")
}

// startDecodeRole starts this test binary as a decode process in role
// (roleEnv): it returns the process, the address it printed first, and the
// rest of its output. The process is killed at the test's end.
func startDecodeRole(t *testing.T, role string) (*exec.Cmd, string, *bufio.Reader) {
	t.Helper()
	dec := exec.Command(os.Args[0], "-test.run=^$")
	dec.Env = append(os.Environ(), roleEnv+"="+role)
	dec.Stderr = os.Stderr
	out, err := dec.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, dec.Start())
	t.Cleanup(func() { _ = dec.Process.Kill(); _ = dec.Wait() })
	lines := bufio.NewReader(out)
	addr, err := lines.ReadString('\n')
	require.NoError(t, err, "the decode process printed no address")
	return dec, strings.TrimSpace(addr), lines
}

// stopDecode SIGSTOPs the decode process and returns once every thread of
// it is stopped: kill(2) only queues the stop, and until the thread that
// takes it runs, the others go on, so a message sent right after the signal
// could still be answered.
func stopDecode(t *testing.T, dec *exec.Cmd) {
	t.Helper()
	require.NoError(t, dec.Process.Signal(syscall.SIGSTOP))
	pid := dec.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	for !etcdproc.ThreadsStopped(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("decode process %d: some thread not stopped 10s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// runPrefillProcess runs this test binary as a prefill process in role
// (roleEnv, its arguments included) to its end.
func runPrefillProcess(t *testing.T, role string) {
	t.Helper()
	pre := exec.Command(os.Args[0], "-test.run=^$")
	pre.Env = append(os.Environ(), roleEnv+"="+role)
	pre.Stdout, pre.Stderr = os.Stderr, os.Stderr
	require.NoError(t, pre.Run(), "the prefill process failed (its stderr above)")
}

// longReason is a cancel reason (and a prefill's abort) of 1200 bytes of
// 3-byte characters: any byte bound cuts it within a character unless it
// cuts at a boundary, and a string field that is not UTF-8 cannot be
// marshaled, so protoactor drops the message that carries it.
var longReason = strings.Repeat("取消", 200)

// longAbort is a prefill's abort of 4200 bytes of the same characters,
// beyond the 4096 bytes a decode keeps of one.
var longAbort = strings.Repeat("取消", 700)

// runLongCancelDecodeRole cancels room 1 with longReason once the prefill
// reported in it, then drains; it prints the verdict once the session
// ended (aborted by the prefill's goodbye).
func runLongCancelDecodeRole() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := startCancelRole(ctx)
	if err != nil {
		return err
	}
	defer r.stop()
	srv, ss := r.srv, r.ss
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	if err := srv.Cancel(cctx, 1, longReason); err != nil {
		return fmt.Errorf("cancel with a reason of %d bytes: %w", len(longReason), err)
	}
	// The prefill says goodbye when told of the drain, which it hears
	// after its answer to the cancel arrived.
	go func() { _ = srv.Drain(ctx) }()
	rep, err := ss.Wait(ctx)
	if !errors.Is(err, decode.ErrSessionAborted) || rep.Complete {
		return fmt.Errorf("session: %+v, %v (want it aborted)", rep, err)
	}
	fmt.Println("room cancelled, session aborted")
	return nil
}

// runLongCancelPrefillRole reports room 1's first chunk to the decode at
// addr, answers its cancel through Attach, and says goodbye, aborted with
// longAbort, once the decode drains: the decode's verdict must come back.
func runLongCancelPrefillRole(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, c, err := dialRole(ctx, addr)
	if err != nil {
		return err
	}
	release := make(chan struct{})
	close(release)
	if err := c.Attach(&dropEngine{release: release}); err != nil {
		return err
	}
	drained := make(chan struct{})
	c.OnDrain(func(string) { close(drained) })
	if err := c.Notify(ctx, notice(1, 0, 2, 0, false, system.Succeeded, nil)); err != nil {
		return err
	}
	select {
	case <-drained:
	case <-ctx.Done():
		return errors.New("the decode never drained (its Cancel did not return)")
	}
	_, err = c.Bye(ctx, errors.New(longAbort))
	if !errors.Is(err, decode.ErrSessionAborted) {
		return fmt.Errorf("bye aborted with a reason of %d bytes: want the decode's verdict (ErrSessionAborted), got %w", len(longAbort), err)
	}
	return node.Close(ctx)
}

// TestLongReasonsAcrossProcesses: a cancel's reason and a goodbye's abort
// travel cut to their bounds, at a character boundary: the decode's
// Cancel with a reason of 1200 bytes reaches the prefill, whose Attach
// answers it with that reason quoted (the decode's Cancel returns), and
// the prefill's Bye aborted with one of 4200 bytes gets the decode's
// verdict. Cut
// within a character, each message could not be marshaled and was
// dropped: the Cancel never returned, the Bye timed out.
func TestLongReasonsAcrossProcesses(t *testing.T) {
	runRoles(t, "long-cancel-decode", "long-cancel-prefill", "room cancelled, session aborted")
}

// rawVerdict is a Verify error that quotes the bytes it found: not UTF-8.
const rawVerdict = "checksum mismatch: found \xff\xfe\x00\x01"

// runBytesDecodeRole serves one session whose chunks its Verify rejects
// with rawVerdict, and prints how the session ended.
func runBytesDecodeRole() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := startRoleServer(ctx, func(*decode.Session, decode.Chunk) error { return errors.New(rawVerdict) })
	if err != nil {
		return err
	}
	defer r.stop()
	ss := r.ss
	if _, err := ss.Wait(ctx); !errors.Is(err, decode.ErrChunkFailed) {
		return fmt.Errorf("session: %v (want it failed)", err)
	}
	fmt.Println("session failed")
	return nil
}

// runBytesPrefillRole reports room 1's first chunk to the decode at addr
// and says goodbye: both answers carry the decode's Verify error, and must
// arrive.
func runBytesPrefillRole(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, c, err := dialRole(ctx, addr)
	if err != nil {
		return err
	}
	err = c.Notify(ctx, notice(1, 0, 2, 0, false, system.Succeeded, nil))
	if !errors.Is(err, decode.ErrChunkFailed) {
		return fmt.Errorf("notice: want the decode's refusal (ErrChunkFailed), got %w", err)
	}
	if _, err := c.Bye(ctx, nil); !errors.Is(err, decode.ErrChunkFailed) {
		return fmt.Errorf("bye: want the decode's verdict (ErrChunkFailed), got %w", err)
	}
	return node.Close(ctx)
}

// TestRawTextsAcrossProcesses: a Verify error that is not UTF-8 (it
// quotes the bytes it found) still reaches the prefill, in the answer to
// its notice and in its goodbye's verdict. A string field that is not
// UTF-8 cannot be marshaled, and protoactor dropped the answer: the
// prefill's Notify and Bye timed out instead.
func TestRawTextsAcrossProcesses(t *testing.T) {
	runRoles(t, "bytes-decode", "bytes-prefill", "session failed")
}
