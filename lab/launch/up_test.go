package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdproc"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpWaitsForItsOwnNodes: the launcher waits for the nodes it started,
// by id and by the address each process announced, and names what it
// still waits for; a member it did not start (another cluster's, a stale
// or forged record) neither counts nor stalls it (a forged decode record
// once kept it waiting, silently, for its 2-minute bound).
func TestUpWaitsForItsOwnNodes(t *testing.T) {
	ctx := context.Background()
	local := cluster.NewLocal()
	defer local.Close()
	res := cluster.NewResolver(local)
	defer res.Close()
	for _, role := range cluster.Roles {
		require.NoError(t, res.Follow(role))
	}
	sup := NewSupervisor("/bin/true", nil, nil)
	u := &up{sup: sup, res: res}
	addChild := func(id string, role cluster.Role, rank int, addr string) {
		c := &child{spec: ChildSpec{ID: id, Role: role, Rank: rank}, addr: addr}
		sup.mu.Lock()
		sup.children[id] = c
		sup.mu.Unlock()
	}
	addChild("decode-0", cluster.RoleDecode, 0, "127.0.0.1:9000")
	addChild("decode-1", cluster.RoleDecode, 0, "")
	addChild("g0-r0", cluster.RolePrefill, 0, "127.0.0.1:9100")

	register := func(m cluster.Member) {
		_, err := local.Register(ctx, m)
		require.NoError(t, err)
	}
	register(cluster.Member{ID: "decode-9", Role: cluster.RoleDecode, Addr: "127.0.0.1:6666"}) // not ours
	register(cluster.Member{ID: "decode-0", Role: cluster.RoleDecode, Addr: "127.0.0.1:9000"})
	eventually := func(want string) {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Join(u.missing(), "; ") == want }, 5e9, 1e6, "missing: %v", u.missing())
	}
	eventually("decode decode-1 to start (no ready line yet); prefill g0-r0 to register on etcd")

	c := sup.child("decode-1")
	c.mu.Lock()
	c.addr = "127.0.0.1:9001" // its process announced itself
	c.mu.Unlock()
	register(cluster.Member{ID: "decode-1", Role: cluster.RoleDecode, Addr: "127.0.0.1:7777"})
	register(cluster.Member{ID: "g0-r0", Role: cluster.RolePrefill, Addr: "127.0.0.1:9100", Group: Group, Rank: 0, Size: 2})
	eventually("decode decode-1: etcd lists it at 127.0.0.1:7777, its process serves at 127.0.0.1:9001 (an old lease not expired yet?)")

	// A fresh membership: every node of up's registered at its address,
	// the group still missing a rank.
	local2 := cluster.NewLocal()
	defer local2.Close()
	res2 := cluster.NewResolver(local2)
	defer res2.Close()
	for _, role := range cluster.Roles {
		require.NoError(t, res2.Follow(role))
	}
	u.res = res2
	_, err := local2.Register(ctx, cluster.Member{ID: "decode-0", Role: cluster.RoleDecode, Addr: "127.0.0.1:9000"})
	require.NoError(t, err)
	_, err = local2.Register(ctx, cluster.Member{ID: "decode-1", Role: cluster.RoleDecode, Addr: "127.0.0.1:9001"})
	require.NoError(t, err)
	_, err = local2.Register(ctx, cluster.Member{ID: "g0-r0", Role: cluster.RolePrefill, Addr: "127.0.0.1:9100", Group: Group, Rank: 0, Size: 2})
	require.NoError(t, err)
	eventually(`CP group "g0" of size 2: ranks [1] not registered`)
	_, err = local2.Register(ctx, cluster.Member{ID: "decode-9", Role: cluster.RoleDecode, Addr: "127.0.0.1:6666"})
	require.NoError(t, err)
	_, err = local2.Register(ctx, cluster.Member{ID: "g0-r1", Role: cluster.RolePrefill, Addr: "127.0.0.1:9101", Group: Group, Rank: 1, Size: 2})
	require.NoError(t, err)
	eventually("")
}

// TestFaultsEndWithTheDrain: the context up gives its fault injector ends
// at the drain (the first signal) with its cause, and at a cut (the
// second) too: a rolling restart waited only for the cut, holding the
// drain past --drain-timeout.
func TestFaultsEndWithTheDrain(t *testing.T) {
	for _, first := range []string{"drain", "cut"} {
		accept, drain := context.WithCancelCause(context.Background())
		hard, cut := context.WithCancelCause(context.Background())
		ctx, release := untilEither(accept, hard)
		require.NoError(t, ctx.Err(), "running")
		why := errors.New(first)
		if first == "drain" {
			drain(why)
		} else {
			cut(why)
		}
		<-ctx.Done()
		assert.Equal(t, why, context.Cause(ctx), first)
		release()
		drain(nil)
		cut(nil)
	}
}

// upNodeEnv makes the test binary a node of Up's for
// TestUpReadinessFailsAsTheDrainBegins: unlike the supervisor's fake node
// (main_test.go) it takes Up's arguments and registers on Up's etcd, so
// that Up comes up; it runs no batch (a batch given to it stays in flight
// until the drain's end cuts it) and says on stderr when it got one.
const upNodeEnv = "KVSTREAM_LAUNCH_UP_NODE"

func init() {
	if os.Getenv(upNodeEnv) != "" {
		os.Exit(upNode(os.Args[1:]))
	}
}

// upNode is the node upNodeEnv runs: args are Up's (the command, then
// "--flag value" pairs).
func upNode(args []string) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "up node:", err); return 2 }
	if len(args) == 0 || len(args[1:])%2 != 0 {
		return fail(fmt.Errorf("arguments %q: want a command and --flag value pairs", args))
	}
	flags := map[string]string{}
	for i := 1; i < len(args); i += 2 {
		flags[args[i]] = args[i+1]
	}
	m := cluster.Member{ID: flags["--id"], Role: cluster.RoleDecode}
	if args[0] == "prefill-rank" {
		rank, err := strconv.Atoi(flags["--cp-rank"])
		if err != nil {
			return fail(err)
		}
		size, err := strconv.Atoi(flags["--cp"])
		if err != nil {
			return fail(err)
		}
		m = cluster.Member{ID: fmt.Sprintf("%s-r%d", flags["--cp-group"], rank), Role: cluster.RolePrefill,
			Group: flags["--cp-group"], Rank: rank, Size: size}
	}
	ttl, err := time.ParseDuration(flags["--member-ttl"])
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the address it announces, its own
	if err != nil {
		return fail(err)
	}
	defer ln.Close()
	m.Addr = ln.Addr().String()
	prov, err := cluster.Open(cluster.Config{Endpoints: strings.Split(flags["--etcd"], ","), Prefix: flags["--cluster-prefix"], TTL: ttl})
	if err != nil {
		return fail(err)
	}
	defer prov.Close()
	reg, err := prov.Register(context.Background(), m)
	if err != nil {
		return fail(err)
	}
	defer reg.Close()
	out := NewEmitter(os.Stdout)
	out.Emit(Event{Event: EventReady, ID: m.ID, Addr: m.Addr, Pid: os.Getpid()})
	term, lines := nodeInput()
	for {
		select {
		case <-term:
			return 0
		case l, ok := <-lines:
			if !ok {
				return 0
			}
			if c, err := ParseCommand(l); err == nil {
				fmt.Fprintf(os.Stderr, "holds batch %d\n", c.Batch)
			}
		}
	}
}

// watchedWriter is a syncBuffer whose lines a test waits for.
type watchedWriter struct {
	syncBuffer
	mu      sync.Mutex
	changed chan struct{} // closed at the next Write
}

func (w *watchedWriter) Write(p []byte) (int, error) {
	n, err := w.syncBuffer.Write(p)
	w.mu.Lock()
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
	w.mu.Unlock()
	return n, err
}

// waitFor waits until what was written holds text; it fails when ended is
// closed first (Up returned) or after bound (a safety net, not the
// oracle: every wait of the test is for an event).
func (w *watchedWriter) waitFor(t *testing.T, text string, ended <-chan struct{}, bound time.Duration) {
	t.Helper()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		if w.changed == nil {
			w.changed = make(chan struct{})
		}
		changed := w.changed
		w.mu.Unlock()
		if strings.Contains(w.String(), text) {
			return
		}
		select {
		case <-changed:
		case <-ended:
			t.Fatalf("up returned before writing %q:\n%s", text, w.String())
		case <-deadline.C:
			t.Fatalf("no %q within %v:\n%s", text, bound, w.String())
		}
	}
}

// TestUpReadinessFailsAsTheDrainBegins: up's /readyz fails as soon as its
// drain begins (the first signal), while a batch is still in flight, not
// only once every batch in flight ended (up to --drain-timeout later; it
// stayed 200 for the whole drain). Under -race this also checks that the
// handler's goroutine reads up's state safely (a plain bool, written by
// Up's goroutine, once was).
func TestUpReadinessFailsAsTheDrainBegins(t *testing.T) {
	if _, err := etcdproc.Binary(); err != nil {
		t.Skip(err)
	}
	ops, err := service.Start(service.Config{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer ops.Close(context.Background())
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	readyz := func() (int, string) {
		t.Helper()
		resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Get("http://" + ops.Addr() + "/readyz")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	inFlight := func() float64 {
		t.Helper()
		mfs, err := ops.Registry().Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == MetricUpBatchesInFlight {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s served", MetricUpBatchesInFlight)
		return 0
	}

	accept, drain := context.WithCancelCause(context.Background())
	defer drain(nil)
	hard, cut := context.WithCancelCause(context.Background())
	defer cut(nil)
	var stderr watchedWriter
	var rep *Report
	var upErr error
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		rep, upErr = Up(accept, hard, Config{Exe: os.Args[0], Env: append(os.Environ(), upNodeEnv+"=1"),
			Ranks: 1, Decodes: 1, Batches: 1, Requests: 1, PageSize: 16, Transport: "tcp",
			Prefix: "/kvstream/up-test-" + strconv.Itoa(os.Getpid()),
			// Only the cut below ends the batch: the drain, and the batch's
			// own bound (2×FinishTimeout + 2 minutes), would wait longer.
			FinishTimeout: 10 * time.Minute, DrainTimeout: 10 * time.Minute, Ops: ops, Stderr: &stderr})
	}()
	// The batch is in flight (its rank holds it: no room will ever end).
	stderr.waitFor(t, "g0-r0: holds batch 0", ended, 3*time.Minute)
	code, body := readyz()
	require.Equal(t, http.StatusOK, code, "the run goes on: %s", body)
	require.Equal(t, 1.0, inFlight())

	drain(errors.New("test drain"))
	stderr.waitFor(t, "up: draining (test drain)", ended, 3*time.Minute)
	code, body = readyz()
	assert.Equal(t, http.StatusServiceUnavailable, code, "/readyz while the drain waits for the batch in flight: %s", body)
	assert.Contains(t, body, "[-]draining")
	require.Equal(t, 1.0, inFlight(), "the batch is still in flight")

	cut(errors.New("test cut"))
	<-ended
	require.NoError(t, upErr)
	require.NotNil(t, rep.Drain)
	assert.Equal(t, "test drain", rep.Drain.Reason)
	code, body = readyz()
	assert.Equal(t, http.StatusServiceUnavailable, code, "/readyz once the run ended: %s", body)
}

// TestRestartsCountOnlyRestarts: kvstream_up_node_restarts_total counts a
// node's restart once its new process started; a restart that failed (the
// binary could not be started; the supervisor stopping) is a note, not a
// count (it was counted before Restart, whatever Restart returned).
func TestRestartsCountOnlyRestarts(t *testing.T) {
	for _, tc := range []struct {
		name, exe string
		restarts  float64
		note      string
	}{
		{"started", os.Args[0], 1, "decode-0 restarted after the fault"},
		{"exec fails", filepath.Join(t.TempDir(), "no-such-kvstream"), 0, "restart decode-0: start node decode-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sup := NewSupervisor(tc.exe, nil, nil)
			defer sup.Close()
			spec := fakeSpec("decode-0", cluster.RoleDecode, 0)
			sup.mu.Lock()
			sup.children[spec.ID] = &child{spec: spec}
			sup.mu.Unlock()
			m, err := newUpMetrics(nil)
			require.NoError(t, err)
			u := &up{sup: sup, book: newBook(1, 1), m: m, inj: &injector{fault: KillDecode, killed: spec.ID}}
			u.exited(ChildEvent{ID: spec.ID, Role: cluster.RoleDecode, Exit: true, ExitErr: errors.New("signal: killed")})
			assert.Equal(t, tc.restarts, counted(t, m.restarts))
			notes := u.inj.Notes()
			require.Len(t, notes, 1, "%q", notes)
			assert.Contains(t, notes[0], tc.note)
			if tc.restarts > 0 {
				assert.True(t, sup.State(spec.ID).Running, "restarted")
			}
		})
	}
}

// counted is a counter's value.
func counted(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}
