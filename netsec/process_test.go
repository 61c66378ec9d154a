//go:build unix

package netsec

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/lab/stallprobe"
	"github.com/stretchr/testify/require"
)

// A real peer process, reached over mutual TLS by a real node in each
// direction, is SIGSTOPped: its connections stay open but nothing answers,
// which protoactor's remote termination never notices. The node's
// heartbeat monitor declares it lost within the bound.
func TestHeartbeatsFindStoppedProcess(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), peerRoleEnv+"="+fx.dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // a stopped process takes SIGKILL too
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the peer process printed no address")
	peer := actor.NewPID(strings.TrimSpace(line), HeartbeatActor)

	// One round trip first: both directions connect and verify.
	res, err := fx.n.system.Root.RequestFuture(peer, &Ping{Seq: 1}, 10*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, uint64(1), res.(*Pong).Seq)

	cfg := HeartbeatConfig{Interval: 100 * time.Millisecond, Misses: 5}
	lost := make(chan error, 1)
	m, err := WatchHeartbeats(fx.n.system, peer, cfg, func(err error) { lost <- err })
	require.NoError(t, err)
	defer m.Stop()

	probe := stallprobe.Start()
	defer probe.Close()
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	select {
	case err := <-lost:
		took := time.Since(stopped)
		require.ErrorIs(t, err, ErrPeerLost)
		// Within the bound plus 500 ms of scheduling, plus however long
		// this process was stalled (its monitor's ticks came that late).
		if over := took - (cfg.Bound() + 500*time.Millisecond); over > 0 {
			st := probe.Stalled(stopped, stopped.Add(took))
			require.GreaterOrEqual(t, st, over, "declared lost %v after SIGSTOP (bound %v), later by more than the process was stalled (%v)", took, cfg.Bound(), st)
		}
		t.Logf("stopped process declared lost after %v (bound %v)", took.Round(time.Millisecond), cfg.Bound())
	case <-time.After(10 * time.Second):
		t.Fatal("stopped process never declared lost")
	}
}
