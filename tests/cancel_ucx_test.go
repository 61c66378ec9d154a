//go:build ucx

package tests

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/ucx"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// cancelRoleEnv makes the test binary one side of TestUCXCancelAcrossProcesses:
// "decode" or "prefill ADDR".
const cancelRoleEnv = "KVSTREAM_TESTS_CANCEL_ROLE"

const (
	ucxLayers  = 2
	ucxItemLen = 4096
	ucxPages   = 8
)

func init() {
	role := os.Getenv(cancelRoleEnv)
	if role == "" {
		return
	}
	f := append(strings.Fields(role), "")
	var err error
	if f[0] == "decode" {
		err = runUCXCancelDecode()
	} else {
		err = runUCXCancelPrefill(f[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, role+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runUCXCancelDecode serves one prefill over UCX, cancels room 1 when its
// stdin says "cancel" (the prefill posted its first layer group), and
// prints the verdict: the cancel returned once the prefill's writes
// stopped, the pages went to another room, the second layer's pages were
// never written, the session ended complete.
func runUCXCancelDecode() error {
	tr, err := ucx.New(ucx.Options{Name: "decode", CloseDrain: time.Second})
	if err != nil {
		return err
	}
	defer tr.Close()
	pool, err := hostmem.Alloc(ucxLayers * ucxItemLen * ucxPages)
	if err != nil {
		return err
	}
	defer pool.Free()
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer node.Close(ctx)
	srv, err := decode.New(node, tr, decode.Config{ByeGrace: time.Hour, Buffers: []decode.Buffer{
		{Name: "KV0", Base: pool.Addr, ItemLen: ucxItemLen, Pages: ucxPages},
		{Name: "KV1", Base: pool.Addr + ucxItemLen*ucxPages, ItemLen: ucxItemLen, Pages: ucxPages},
	}})
	if err != nil {
		return err
	}
	defer srv.Close(ctx)
	dst := []int{5, 2}
	if err := srv.Expect(1, dst); err != nil {
		return err
	}
	fmt.Println(node.Addr())
	ss, err := srv.Accept(ctx)
	if err != nil {
		return err
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "cancel" {
		return fmt.Errorf("stdin: %q, %v", line, err)
	}
	start := time.Now()
	if err := srv.Cancel(ctx, 1, "the scheduler gave up"); err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	fmt.Fprintf(os.Stderr, "decode: Server.Cancel took %v over UCX across processes (a group posted; call to pages freed)\n", time.Since(start))
	fmt.Println("cancel returned")
	if err := srv.Expect(2, dst); err != nil {
		return fmt.Errorf("the cancelled room's pages are not free: %w", err)
	}
	rep, err := ss.Wait(ctx)
	if err != nil || !rep.Complete && !rep.Empty {
		return fmt.Errorf("session: %+v, %v", rep, err)
	}
	layer1 := pool.Bytes[ucxItemLen*ucxPages:]
	for _, p := range dst {
		if !bytes.Equal(make([]byte, ucxItemLen), layer1[p*ucxItemLen:(p+1)*ucxItemLen]) {
			return fmt.Errorf("layer 1 page %d was written after the cancel", p)
		}
	}
	fmt.Println("cancelled, pages free, no later group landed")
	return nil
}

// runUCXCancelPrefill streams room 1 into the decode at addr with a real
// engine over UCX: it posts layer 0's group, says "posted" (stdout), and
// once the decode's cancel was answered (Attach: the engine's CancelRoom, then
// Cancel) ends the forward, whose layer 1 posts nothing of the dropped
// room.
func runUCXCancelPrefill(addr string) error {
	tr, err := ucx.New(ucx.Options{Name: "prefill", CloseDrain: time.Second})
	if err != nil {
		return err
	}
	defer tr.Close()
	pool, err := hostmem.Alloc(ucxLayers * ucxItemLen * ucxPages)
	if err != nil {
		return err
	}
	defer pool.Free()
	for i := range pool.Bytes {
		pool.Bytes[i] = 0xab
	}
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer node.Close(ctx)
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	cfg := system.Config{Buffers: system.MLABuffers([]uint64{pool.Addr, pool.Addr + ucxItemLen*ucxPages}, ucxItemLen, ucxPages),
		HookLayers: ucxLayers, GroupSize: 1, PageSize: 16}
	eng, err := system.New(cfg, system.WithStream(gpu.NewStream("compute")), system.WithTransport(tr), system.WithLogger(zap.NewNop()))
	if err != nil {
		return err
	}
	defer eng.Close()
	sess, err := decode.Dial(ctx, node, decode.DialConfig{Decode: addr, Buffers: cfg.Buffers, PageSize: cfg.PageSize})
	if err != nil {
		return err
	}
	cancelled := make(chan uint64, 1)
	sess.OnCancel(func(room uint64, _ string) { cancelled <- room })
	if err := sess.Attach(eng); err != nil {
		return err
	}
	spec := system.ChunkSpec{Room: 1, Start: 0, End: 32, Last: true, SrcPages: []int{0, 1}, TotalPages: 2,
		Infos: []system.DecodeInfo{{Peer: sess.Peer().ID, DstPages: []int{5, 2}}}}
	if _, err := eng.Register(ctx, spec); err != nil {
		return err
	}
	fw, err := eng.BeginForward()
	if err != nil {
		return err
	}
	if err := fw.LayerEnd(0); err != nil {
		return err
	}
	fmt.Println("posted")
	select {
	case <-cancelled:
	case <-ctx.Done():
		return errors.New("the decode's cancel never came")
	}
	// Attach drops the room, then answers; the decode's Cancel returned
	// (stdin says so) only after that answer, so the Drop returned.
	if line, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil || strings.TrimSpace(line) != "go on" {
		return fmt.Errorf("stdin: %q, %v", line, err)
	}
	if eng.HasRoom(1) {
		return errors.New("the decode's cancel returned before the engine dropped the room")
	}
	if err := fw.LayerEnd(1); err != nil {
		return err
	}
	if err := fw.End(); err != nil {
		return err
	}
	if _, err := eng.Finish(ctx, 1); !errors.Is(err, system.ErrNoChunk) {
		return fmt.Errorf("finish of the dropped room: %v", err)
	}
	if err := eng.Close(); err != nil {
		return err
	}
	_, err = sess.Bye(ctx, nil)
	return err
}

// TestUCXCancelAcrossProcesses: a prefill process streams a room over UCX
// into a decode process with a real engine; after its first layer group is
// posted the decode cancels the room: the prefill's engine drops it (no
// further group is posted), the decode's Cancel returns once the prefill
// answered, the pages go to another room, and the second layer's pages
// were never written.
func TestUCXCancelAcrossProcesses(t *testing.T) {
	env := append(os.Environ(), "UCX_TLS=tcp")
	dec := exec.Command(os.Args[0], "-test.run=^$")
	dec.Env = append(env, cancelRoleEnv+"=decode")
	dec.Stderr = os.Stderr
	decIn, err := dec.StdinPipe()
	require.NoError(t, err)
	out, err := dec.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, dec.Start())
	t.Cleanup(func() { _ = dec.Process.Kill() })
	lines := bufio.NewReader(out)
	addr, err := lines.ReadString('\n')
	require.NoError(t, err, "the decode process printed no address")

	pre := exec.Command(os.Args[0], "-test.run=^$")
	pre.Env = append(env, cancelRoleEnv+"=prefill "+strings.TrimSpace(addr))
	pre.Stderr = os.Stderr
	preIn, err := pre.StdinPipe()
	require.NoError(t, err)
	preOut, err := pre.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, pre.Start())
	t.Cleanup(func() { _ = pre.Process.Kill() })
	posted, err := bufio.NewReader(preOut).ReadString('\n')
	require.NoError(t, err, "the prefill process said nothing (its stderr above)")
	require.Equal(t, "posted", strings.TrimSpace(posted))
	_, err = fmt.Fprintln(decIn, "cancel")
	require.NoError(t, err)
	returned, err := lines.ReadString('\n')
	require.NoError(t, err, "the decode process's cancel did not return (its stderr above)")
	require.Equal(t, "cancel returned", strings.TrimSpace(returned))
	_, err = fmt.Fprintln(preIn, "go on")
	require.NoError(t, err)
	require.NoError(t, pre.Wait(), "the prefill process failed (its stderr above)")
	verdict, err := lines.ReadString('\n')
	require.NoError(t, err, "the decode process printed no verdict (its stderr above)")
	require.Equal(t, "cancelled, pages free, no later group landed", strings.TrimSpace(verdict))
	require.NoError(t, dec.Wait(), "the decode process did not end cleanly (its stderr above)")
}
