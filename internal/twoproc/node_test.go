package twoproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// roleEnv makes the test binary one side of a session: "decode" or
// "prefill ADDR". Each side is its own process, as in production (and
// because protoactor-go remote sets grpc's global logger on every start, a
// second node in one process races with the first one's leftovers).
const roleEnv = "KVSTREAM_TWOPROC_TEST_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		var err error
		if addr, ok := strings.CutPrefix(role, "prefill "); ok {
			err = runPrefill(addr)
		} else {
			err = runDecode()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, role+":", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func runDecode() error {
	// Only the prefill leaving may end the session: a grace period that
	// ended it instead would hide a lost Terminated.
	byeGrace = time.Hour
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	if err != nil {
		return err
	}
	defer tr.Close()
	d, err := StartDecode("127.0.0.1:0", tr, zap.NewNop())
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Println(d.Addr())
	s, err := d.Wait(time.Minute)
	if err != nil {
		return err
	}
	if !s.OK() {
		return errors.New(s.String())
	}
	return nil
}

func runPrefill(decodeAddr string) error {
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("prefill")
	if err != nil {
		return err
	}
	defer tr.Close()
	p, err := NewPrefill("127.0.0.1:0", decodeAddr, tr, zap.NewNop())
	if err != nil {
		return err
	}
	if _, peer, err := p.Open(testbed.MLA(2, 64, 4), 1, zap.NewNop()); err != nil || len(peer.Buffers) != 2 {
		return errors.Newf("open: %d buffers, %v", len(peer.Buffers), err)
	}
	for _, id := range endpointActors {
		if _, ok := p.node.system.ProcessRegistry.GetLocal(id); !ok {
			return errors.Newf("protoactor-go remote has no actor named %q: stop would leave it running", id)
		}
	}
	if err := p.Close(); err != nil {
		return err
	}
	p.mu.Lock()
	summary := p.summary
	p.mu.Unlock()
	if summary == nil {
		return errors.New("the decode process's Summary did not arrive")
	}
	for _, id := range endpointActors {
		if _, ok := p.node.system.ProcessRegistry.GetLocal(id); ok {
			return errors.Newf("endpoint actor %q still running after stop", id)
		}
	}
	return nil
}

// TestSessionEnd ends a session the way every two-process run ends: Bye,
// the decode process's Summary, both nodes stopping. The Summary must reach
// the prefill (the decode side waits for the prefill to leave before it
// stops), the decode process must see the prefill leave, and neither side's
// stop may race with its connection goroutines noticing the other go, as
// Remote.Shutdown(true) did (CI caught it under -race; a race report makes
// the child exit non-zero).
func TestSessionEnd(t *testing.T) {
	dec := exec.Command(os.Args[0], "-test.run=^$")
	dec.Env = append(os.Environ(), roleEnv+"=decode")
	dec.Stderr = os.Stderr
	out, err := dec.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, dec.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = dec.Process.Kill()
		_ = dec.Wait()
		require.NoError(t, err, "the decode process printed no address")
	}

	pre := exec.Command(os.Args[0], "-test.run=^$")
	pre.Env = append(os.Environ(), roleEnv+"=prefill "+strings.TrimSpace(line))
	pre.Stdout, pre.Stderr = os.Stderr, os.Stderr
	preErr := pre.Run()
	decErr := dec.Wait()
	require.NoError(t, preErr, "the prefill process failed (its stderr above)")
	require.NoError(t, decErr, "the decode process did not end its session cleanly (its stderr above)")
}
