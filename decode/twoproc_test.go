package decode_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
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
	switch kind, addr, _ := strings.Cut(role, " "); kind {
	case "decode":
		err = runDecodeRole()
	default:
		err = runPrefillRole(addr, kind == "vanish")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, role+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runDecodeRole serves one session and prints how it ended: "complete" or
// the error's class.
func runDecodeRole() error {
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
	node, err := decode.Listen("127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer node.Close(ctx)
	// Only the prefill leaving may end the session: a grace period that
	// ended it instead would hide a lost Terminated.
	srv, err := decode.New(node, tr, decode.Config{Buffers: decodeBuffers(pool), ByeGrace: time.Hour})
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

func runPrefillRole(addr string, vanish bool) error {
	node, err := decode.Listen("127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := decode.Dial(ctx, node, decode.DialConfig{Decode: addr, Buffers: prefillLayout(itemLen)})
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
			dec := exec.Command(os.Args[0], "-test.run=^$")
			dec.Env = append(os.Environ(), roleEnv+"=decode")
			dec.Stderr = os.Stderr
			out, err := dec.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, dec.Start())
			t.Cleanup(func() { _ = dec.Process.Kill() })
			lines := bufio.NewReader(out)
			addr, err := lines.ReadString('\n')
			require.NoError(t, err, "the decode process printed no address")

			pre := exec.Command(os.Args[0], "-test.run=^$")
			pre.Env = append(os.Environ(), roleEnv+"="+tc.prefill+" "+strings.TrimSpace(addr))
			pre.Stdout, pre.Stderr = os.Stderr, os.Stderr
			require.NoError(t, pre.Run(), "the prefill process failed (its stderr above)")
			verdict, err := lines.ReadString('\n')
			require.NoError(t, err, "the decode process printed no verdict (its stderr above)")
			require.Equal(t, tc.want, strings.TrimSpace(verdict))
			require.NoError(t, dec.Wait(), "the decode process did not end cleanly (its stderr above)")
		})
	}
}
