package stallprobe

import (
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The arithmetic adds up the stalls inside an interval, and the probe sees
// a real stall: a child process stops this one (SIGSTOP, as a starved
// process is not run) for 300 ms.
func TestProbeSeesAStop(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	stalls := []Interval{{at(0), at(10)}, {at(20), at(50)}, {at(100), at(101)}}
	require.Equal(t, 40*time.Millisecond, Overlap(stalls, at(0), at(60)))
	require.Equal(t, 15*time.Millisecond, Overlap(stalls, at(5), at(30)))
	require.Zero(t, Overlap(stalls, at(60), at(100)))

	p := Start()
	defer p.Close()
	from := time.Now()
	require.NoError(t, exec.Command("sh", "-c", "kill -STOP $PPID; sleep 0.3; kill -CONT $PPID").Run())
	to := time.Now()
	st := p.Stalled(from, to)
	require.GreaterOrEqual(t, st, 250*time.Millisecond, "a 300 ms stop seen as %v", st)
	require.LessOrEqual(t, st, to.Sub(from))
}
