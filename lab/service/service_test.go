package service

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/stacks"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// get fetches a path without keeping the connection (goleak).
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestOpsEndpoints: /metrics serves the registry, /healthz answers while
// the process works, /readyz follows the command's checks and the drain.
func TestOpsEndpoints(t *testing.T) {
	ops, err := Start(Config{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer ops.Close(context.Background())
	require.NotEqual(t, "127.0.0.1:0", ops.Addr())
	require.NotNil(t, ops.Registerer())

	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstream_test_total", Help: "A test counter."})
	ops.Registry().MustRegister(c)
	c.Add(2)
	code, body := get(t, ops.Addr(), "/metrics")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "kvstream_test_total 2")
	assert.Contains(t, body, "go_goroutines")
	assert.Contains(t, body, "process_start_time_seconds")

	code, body = get(t, ops.Addr(), "/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok\n", body)

	// No readiness check yet: the command is starting, not ready.
	code, body = get(t, ops.Addr(), "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "[-]starting")
	assert.ErrorContains(t, ops.Readiness(), "starting")

	registered := false
	ops.Ready("registered", func(context.Context) error {
		if !registered {
			return errors.New("not registered on etcd yet")
		}
		return nil
	})
	ops.Ready("pool", func(context.Context) error { return nil })
	code, body = get(t, ops.Addr(), "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "[-]registered: not registered on etcd yet")
	assert.NotContains(t, body, "pool", "a passing check is listed with ?verbose only")
	assert.ErrorContains(t, ops.Readiness(), "registered: not registered on etcd yet")

	registered = true
	code, body = get(t, ops.Addr(), "/readyz?verbose")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "[+]pool ok\n[+]registered ok\nok\n", body)
	assert.NoError(t, ops.Readiness())

	ops.SetDraining()
	code, body = get(t, ops.Addr(), "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "[-]draining")
	code, _ = get(t, ops.Addr(), "/healthz")
	assert.Equal(t, http.StatusOK, code, "a draining process still works")

	ops.Live("loop", func(context.Context) error { panic("wedged") })
	code, body = get(t, ops.Addr(), "/healthz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "check loop panicked: wedged")

	require.NoError(t, ops.Close(context.Background()))
	c2 := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	_, err = c2.Get("http://" + ops.Addr() + "/healthz")
	assert.Error(t, err, "closed")
	require.NoError(t, ops.Close(context.Background()), "idempotent")
}

// TestOpsWithoutAddress: no address serves nothing, exports nothing to an
// engine, and still answers readiness.
func TestOpsWithoutAddress(t *testing.T) {
	ops, err := Start(Config{})
	require.NoError(t, err)
	assert.Empty(t, ops.Addr())
	assert.Nil(t, ops.Registerer())
	assert.NotNil(t, ops.Registry())
	ops.Ready("x", func(context.Context) error { return errors.New("no") })
	assert.ErrorContains(t, ops.Readiness(), "x: no")
	require.NoError(t, ops.Close(context.Background()))
}

func TestOpsBadAddress(t *testing.T) {
	_, err := Start(Config{Addr: "nohostport"})
	require.ErrorContains(t, err, `--metrics-addr "nohostport"`)
	ops, err := Start(Config{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer ops.Close(context.Background())
	_, err = Start(Config{Addr: ops.Addr()})
	require.ErrorContains(t, err, ops.Addr(), "a busy address fails at once")
}

// TestShutdownStages: the first signal starts the drain, the second
// abandons it; the reason is the first signal's.
func TestShutdownStages(t *testing.T) {
	s := OnSignals()
	defer s.Stop()
	select {
	case <-s.Draining():
		t.Fatal("draining before any signal")
	default:
	}
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	<-s.Draining()
	assert.Equal(t, "terminated", s.Reason())
	assert.NoError(t, s.Hard().Err(), "one signal does not abandon the drain")
	s.Trigger("stdin closed")
	<-s.Hard().Done()
	assert.Equal(t, "terminated", s.Reason())
	assert.EqualError(t, context.Cause(s.Hard()), "cut by a second stop (stdin closed, after terminated)")
	assert.EqualError(t, context.Cause(Cut()), "cut by a second stop (stdin closed, after terminated)", "the process's cut")
}

func TestInFlight(t *testing.T) {
	var f InFlight
	require.NoError(t, f.Wait(context.Background()), "nothing in flight")
	f.Add()
	f.Add()
	assert.Equal(t, 2, f.Count())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, f.Wait(ctx), context.DeadlineExceeded)
	waited := make(chan error, 1)
	go func() { waited <- f.Wait(context.Background()) }()
	f.Done()
	f.Done()
	require.NoError(t, <-waited)
	assert.Equal(t, int64(2), f.Started())
	assert.Panics(t, f.Done)
}

// A Wait that saw work in flight returns only once none is: work added
// after the count fell to zero (a session accepted while the drain
// waited, before its Stop took effect) is waited for too. Wait returned
// at the idle moment in between, and the drain's goodbye then cut the
// new session as if the work had ended.
func TestInFlightWaitsForWorkAddedAfterIdle(t *testing.T) {
	var f InFlight
	f.Add()
	waited := make(chan error, 1)
	go func() { waited <- f.Wait(context.Background()) }()
	// Parked in its select: it holds the idle channel of the first work.
	require.Eventually(t, func() bool { return stacks.Blocked("(*InFlight).Wait", nil) }, time.Minute, time.Millisecond)
	f.Done()
	f.Add()
	// Parked again, on the new work's channel: it did not return.
	require.Eventually(t, func() bool { return stacks.Blocked("(*InFlight).Wait", nil) || len(waited) > 0 }, time.Minute, time.Millisecond)
	select {
	case err := <-waited:
		t.Fatalf("Wait returned (%v) with %d in flight", err, f.Count())
	default:
	}
	f.Done()
	require.NoError(t, <-waited)
}

// TestDrainFinishesInFlight: work that ends within the timeout is not
// lost; the steps run in order; readiness fails from the first step.
func TestDrainFinishesInFlight(t *testing.T) {
	ops, err := Start(Config{})
	require.NoError(t, err)
	obs, logs := observer.New(zap.InfoLevel)
	var f InFlight
	f.Add()
	var steps []string
	rep := Drain{
		Timeout: 10 * time.Second, Ops: ops, Reason: "terminated",
		Stop: func(context.Context) error {
			steps = append(steps, "stop")
			assert.True(t, ops.Draining(), "readiness fails before anything stops")
			go f.Done() // the work in flight ends after the stop
			return nil
		},
		InFlight: f.Count,
		Wait:     func(ctx context.Context) error { steps = append(steps, "wait"); return f.Wait(ctx) },
		Goodbye:  func(context.Context) error { steps = append(steps, "goodbye"); return nil },
		Log:      zap.New(obs),
	}.Run(context.Background())
	assert.Equal(t, []string{"stop", "wait", "goodbye"}, steps)
	// An operator sees the drain start and end at INFO.
	var lines []string
	for _, e := range logs.All() {
		lines = append(lines, e.Level.String()+" "+e.Message)
	}
	assert.Equal(t, []string{"info drain: begins", "info drain: done"}, lines)
	assert.Equal(t, 1, rep.InFlight)
	assert.Zero(t, rep.Left)
	assert.False(t, rep.Lost(), "%s", rep)
	assert.NoError(t, rep.Err())
	assert.Contains(t, rep.String(), "drain (terminated): 1 in flight at the start, 0 left")
}

// TestDrainTimesOut: work that outlives the timeout is lost, and the
// goodbye still gets its minimum.
func TestDrainTimesOut(t *testing.T) {
	var f InFlight
	f.Add()
	var goodbyeLeft time.Duration
	cut := false
	rep := Drain{
		Timeout: 20 * time.Millisecond, GoodbyeMin: time.Second,
		InFlight: f.Count, Wait: f.Wait,
		Cut: func(ctx context.Context) {
			cut = true
			f.Done() // stopped: counted as lost all the same
			require.NoError(t, f.Wait(ctx))
		},
		Goodbye: func(ctx context.Context) error {
			d, ok := ctx.Deadline()
			require.True(t, ok)
			goodbyeLeft = time.Until(d)
			return errors.New("peer gone")
		},
	}.Run(context.Background())
	assert.True(t, rep.Lost())
	assert.True(t, rep.TimedOut)
	assert.True(t, cut)
	assert.Equal(t, 1, rep.Left, "what the cut stopped was lost")
	assert.Greater(t, goodbyeLeft, 500*time.Millisecond, "the goodbye is not starved by the wait's timeout")
	assert.ErrorContains(t, rep.Err(), "1 left")
	assert.Contains(t, strings.Join(rep.Errors, "\n"), "goodbye: peer gone")
}

// TestDrainAbandoned: a second signal cuts the drain short.
func TestDrainAbandoned(t *testing.T) {
	var f InFlight
	f.Add()
	defer f.Done()
	hard, cancel := context.WithCancel(context.Background())
	start := time.Now()
	rep := Drain{Timeout: time.Hour, InFlight: f.Count,
		Wait: func(ctx context.Context) error { cancel(); return f.Wait(ctx) }}.Run(hard)
	assert.Less(t, time.Since(start), time.Minute)
	assert.True(t, rep.Lost())
}

// CloseWithin adds a failed close to the command's error, naming what
// failed, and leaves a clean one out. Once the process was cut (Cut: other
// tests here cut it) a failed close is said to be abandoned.
func TestCloseWithin(t *testing.T) {
	busy := "close the server: still busy"
	if Cut().Err() != nil {
		busy = "close the server: abandoned: " + context.Cause(Cut()).Error()
	}
	var err error
	CloseWithin("the server", func(ctx context.Context) error {
		_, bounded := ctx.Deadline()
		assert.True(t, bounded, "a close on the way out is bounded")
		return nil
	}, &err)
	require.NoError(t, err)
	CloseWithin("the server", func(context.Context) error { return errors.New("still busy") }, &err)
	require.EqualError(t, err, busy)
	first := errors.New("the run failed")
	err = first
	CloseWithin("the server", func(context.Context) error { return errors.New("still busy") }, &err)
	require.ErrorIs(t, err, first, "the command's own error comes first")
}
