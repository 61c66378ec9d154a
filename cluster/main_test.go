package cluster_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvstream/kvstream/cluster"
)

// memberEnv, when set, makes the test binary a member process instead of
// running tests: it registers "endpoint|id|addr|ttl" as a
// decode instance, prints "registered", and keeps its lease alive until it
// is killed. It is how a test watches a real process die.
const memberEnv = "KVSTREAM_CLUSTER_TEST_MEMBER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMember(spec))
	}
	goleak.VerifyTestMain(m)
}

func runMember(spec string) int {
	parts := strings.Split(spec, "|")
	if len(parts) != 4 {
		fmt.Fprintf(os.Stderr, "bad %s %q\n", memberEnv, spec)
		return 2
	}
	ttl, err := time.ParseDuration(parts[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p, err := cluster.NewEtcd(cluster.Config{Endpoints: []string{parts[0]}, TTL: ttl})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := p.Register(context.Background(), cluster.Member{ID: parts[1], Role: cluster.RoleDecode, Addr: parts[2]}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("registered")
	select {} // until killed: the lease must expire on its own
}

// startMember runs a member process and returns once it registered. The
// process is killed and reaped when the test ends if the test did not.
func startMember(t *testing.T, endpoint, id, addr string, ttl time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memberEnv+"="+strings.Join([]string{endpoint, id, addr, ttl.String()}, "|"))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case l := <-line:
		require.Equal(t, "registered", l, "member process")
	case <-time.After(20 * time.Second):
		t.Fatal("member process did not register within 20s")
	}
	return cmd
}
