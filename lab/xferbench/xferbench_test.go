package xferbench

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDestinationBytes checks the bytes themselves, not only the
// benchmark's own verdict: every slot of the destination holds its source
// slot, and the slots differ from each other, so a write that went to the
// wrong slot would not pass either.
func TestDestinationBytes(t *testing.T) {
	const size, count = 1000, 29 // odd sizes: no alignment helps
	var dst, src []byte
	rep, err := Run(context.Background(), Config{
		Transport: "loopback", Size: size, Count: count, Slots: count, Window: 2, WritesPerBatch: 3,
		Warmup: -1, Repeat: 2, Timeout: time.Minute,
		inspect: func(s, d []byte) { src, dst = bytes.Clone(s), bytes.Clone(d) },
	})
	require.NoError(t, err)
	require.Len(t, dst, count*size, "count × size bytes arrived")
	want := make([]byte, count*size)
	fillPattern(want)
	assert.Equal(t, want, src)
	assert.Equal(t, want, dst)
	for i := 1; i < count; i++ {
		assert.NotEqual(t, dst[:size], dst[i*size:(i+1)*size], "slot %d equals slot 0", i)
	}
	assert.Equal(t, uint64(count*size), rep.VerifiedBytes)
	assert.Equal(t, count, rep.Warmup)
	assert.Equal(t, 1, rep.WarmupRuns, "WarmupFor zero: one warm-up run")
}

// TestWarmupFor: the warm-up repeats its run until WarmupFor has passed,
// and the report says how many runs and how long.
func TestWarmupFor(t *testing.T) {
	const wait = 30 * time.Millisecond
	rep, err := Run(context.Background(), Config{Transport: "loopback", Size: 4096, Count: 8, Slots: 1, Window: 2, WritesPerBatch: 1,
		Warmup: -1, WarmupFor: wait, Repeat: 1, Memcpy: true, Timeout: time.Minute})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, rep.WarmupSeconds, wait.Seconds())
	assert.GreaterOrEqual(t, rep.WarmupRuns, 1)
}

// TestPools: both pools carry the bytes, auto takes the transport's
// allocations (the loopback allocates), and the report says which ran.
func TestPools(t *testing.T) {
	for pool, want := range map[string]string{"": PoolAllocated, PoolAuto: PoolAllocated, PoolAllocated: PoolAllocated, PoolRegistered: PoolRegistered} {
		var dst []byte
		rep, err := Run(context.Background(), Config{Transport: "loopback", Size: 3000, Count: 5, Slots: 5, Window: 2, WritesPerBatch: 2,
			Repeat: 1, Timeout: time.Minute, Pool: pool, inspect: func(_, d []byte) { dst = bytes.Clone(d) }})
		require.NoError(t, err, pool)
		assert.Equal(t, want, rep.Pool, "--pool %q", pool)
		wantBytes := make([]byte, 5*3000)
		fillPattern(wantBytes)
		assert.Equal(t, wantBytes, dst, "--pool %q", pool)
	}
}

// TestVerifyCatchesMissingWrites makes sure the check can fail: a
// destination nothing was written to is reported, naming the slot.
func TestVerifyCatchesMissingWrites(t *testing.T) {
	cfg := Config{Transport: "loopback", Size: 4096, Count: 4, Slots: 4, Window: 1, WritesPerBatch: 1, Repeat: 1, Timeout: time.Minute}
	rig, err := OpenRig(cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, rig.Close()) }()
	err = rig.Verify()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "destination slot 0 differs")

	_, err = rig.Puts(context.Background(), 3) // slots 0..2, not 3
	require.NoError(t, err)
	err = rig.Verify()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "destination slot 3 differs")

	_, err = rig.Puts(context.Background(), 4)
	require.NoError(t, err)
	require.NoError(t, rig.Verify())
}

// TestConfigErrors: a bad configuration is refused before anything is
// opened, naming the flag of `kvstream bench transport` it comes from
// (cmd/kvstream's TestBenchBadFlags covers every flag through the CLI).
func TestConfigErrors(t *testing.T) {
	good := Config{Transport: "loopback", Size: 4096, Count: 4, Slots: 1, Window: 1, WritesPerBatch: 1, Repeat: 1, Timeout: time.Minute}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Size = 0 }, "--size 0: must be positive"},
		{func(c *Config) { c.Window = 1 << 20 }, "--window 1048576: at most 65536"},
		{func(c *Config) { c.Timeout = 0 }, "--timeout 0s: must be positive"},
		{func(c *Config) { c.WarmupFor = -time.Second }, "--warmup-for -1s: must not be negative"},
		{func(c *Config) { c.WarmupFor = time.Minute }, "--warmup-for 1m0s: must be shorter than --timeout 1m0s"},
		{func(c *Config) { c.Transport = "ucx" }, `--transport "ucx": only loopback is built in, and no opener was given for it`},
		{func(c *Config) { c.Pool = "pinned" }, `--pool "pinned": want auto, allocated or registered`},
		{func(c *Config) { c.Perftest = true }, `--perftest: ucx_perftest measures UCX; use it with --transport ucx, not "loopback"`},
	} {
		cfg := good
		tc.edit(&cfg)
		_, err := Run(context.Background(), cfg)
		require.Error(t, err, tc.want)
		assert.Contains(t, err.Error(), tc.want)
	}

	cfg := good
	cfg.Slots, cfg.Warmup = 10, -1
	require.NoError(t, cfg.validate())
	assert.Equal(t, 4, cfg.Slots, "slots capped at the count")
	assert.Equal(t, 4, cfg.Warmup, "a whole run of warm-up")
}

// TestReportJSONAndLine: the report's JSON names and its line are what
// `kvstream bench transport` prints.
func TestReportJSONAndLine(t *testing.T) {
	r := &Report{Transport: "loopback", Size: 64 << 10, Count: 4, Window: 2, WritesPerBatch: 2, Slots: 1, Repeat: 2, Bytes: 4 * 64 << 10,
		Pool: PoolRegistered, VerifiedBytes: 64 << 10, Runs: []RunResult{{Seconds: 1e-3, BytesPerSecond: 4 * 64 << 10 * 1e3}, {Seconds: 3e-3, BytesPerSecond: 4 * 64 << 10 * 1e3 / 3}}}
	r.summarize(false, false)
	assert.InDelta(t, 2e-3, r.Seconds, 1e-12, "the median of two runs is their mean")
	assert.Equal(t, "loopback: 4 × 64 KiB puts, window 2 × 2 writes, registered pools: 0.13 GB/s (125 MiB/s) in 0.002 s (median of 2, 0.09 GB/s–0.26 GB/s); 64 KiB verified", r.Line())
	b, err := json.Marshal(r)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.NotContains(t, m, "ratio_to_memcpy")
	assert.NotContains(t, m, "ucx_tls")
	assert.Contains(t, m, "writes_per_batch")
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"1": 1, "65536": 65536, "64K": 64 << 10, "64k": 64 << 10, "64KiB": 64 << 10, "64KB": 64 << 10,
		"1M": 1 << 20, "4MiB": 4 << 20, "4 MiB": 4 << 20, "1G": 1 << 30, "2gib": 2 << 30, "100B": 100,
	} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
		// What FormatBytes prints, ParseSize reads back (flag defaults).
		back, err := ParseSize(FormatBytes(got))
		require.NoError(t, err, in)
		assert.Equal(t, got, back, in)
	}
	assert.Equal(t, "5000 MiB", FormatBytes(5000<<20))
	assert.Equal(t, "1000 B", FormatBytes(1000))
}

// instantEndpoint completes every batch at once. It breaks the contract
// (done runs inside Post), which is harmless here and leaves no transport
// allocation in the count below.
type instantEndpoint struct{ rdma.Endpoint }

func (instantEndpoint) Post(_ []rdma.Write, done func(error)) error { done(nil); return nil }

// rigPostingTo opens a rig for cfg whose posts go to ep instead of the
// transport; the transport's endpoint is put back before the rig closes.
func rigPostingTo(t *testing.T, cfg Config, ep rdma.Endpoint) *Rig {
	t.Helper()
	rig, err := OpenRig(cfg)
	require.NoError(t, err)
	orig := rig.ep
	rig.ep = ep
	t.Cleanup(func() {
		rig.ep = orig
		require.NoError(t, rig.Close())
	})
	return rig
}

// TestPostLoopAllocatesNothing: the posting loop adds no allocation of
// its own to what the transport's Post costs.
func TestPostLoopAllocatesNothing(t *testing.T) {
	cfg := Config{Transport: "loopback", Size: 4096, Count: 1000, Slots: 7, Window: 8, WritesPerBatch: 3, Repeat: 1, Timeout: time.Minute}
	rig := rigPostingTo(t, cfg, instantEndpoint{})
	ctx := context.Background()
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := rig.Puts(ctx, cfg.Count); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}

// BenchmarkPuts is the posting loop over loopback as a Go benchmark: one
// 64 KiB write per batch, 64 batches in flight, 64 slots.
func BenchmarkPuts(b *testing.B) {
	rig, err := OpenRig(Config{Transport: "loopback", Size: 64 << 10, Count: 64, Slots: 64, Window: 64, WritesPerBatch: 1, Repeat: 1, Timeout: time.Minute})
	require.NoError(b, err)
	defer func() { require.NoError(b, rig.Close()) }()
	b.SetBytes(64 << 10)
	b.ReportAllocs()
	b.ResetTimer()
	if _, err := rig.Puts(context.Background(), b.N); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if b.N >= 64 { // every slot written
		require.NoError(b, rig.Verify())
	}
}

// TestPerftestSummary: ucx_perftest's figures and the ratios, on a case
// computed by hand. Three rounds: the transport at 1, 2 and 4 GB/s;
// ucx_perftest's default buffers at 2, 2 and 5 GB/s (ratios 0.5, 1, 0.8:
// median 0.8, while the ratio of the medians would be 1); mmap,heap at 1,
// 4 and 2 GB/s (ratios 1, 0.5, 2: median 1).
func TestPerftestSummary(t *testing.T) {
	const bytes = 1e9
	r := &Report{Transport: "ucx", UCXTLS: "tcp", Size: 1 << 20, Count: 1000, Window: 64, WritesPerBatch: 1, Slots: 1, Repeat: 3,
		Pool: PoolAllocated, Bytes: bytes, VerifiedBytes: 1 << 20, Runs: []RunResult{
			{Seconds: 1, BytesPerSecond: 1e9, PerftestBytesPerSecond: []float64{2e9, 1e9}},
			{Seconds: 0.5, BytesPerSecond: 2e9, PerftestBytesPerSecond: []float64{2e9, 4e9}},
			{Seconds: 0.25, BytesPerSecond: 4e9, PerftestBytesPerSecond: []float64{5e9, 2e9}},
		}}
	r.summarize(false, true)
	require.Len(t, r.Perftest, 2)
	def, heap := r.Perftest[0], r.Perftest[1]
	assert.Equal(t, "default", def.Buffers)
	assert.Equal(t, "mmap,heap", heap.Buffers)
	assert.Equal(t, "mmap,heap", heap.AllocPrio)
	assert.InDelta(t, 2e9, def.BytesPerSecond, 1)
	assert.InDelta(t, 5e9, def.BytesPerSecondMax, 1)
	assert.InDelta(t, 0.8, def.Ratio, 1e-12)
	assert.InDelta(t, 0.5, def.RatioMin, 1e-12)
	assert.InDelta(t, 1.0, def.RatioMax, 1e-12)
	assert.InDelta(t, 1.0, heap.Ratio, 1e-12)
	assert.InDelta(t, 2e9, r.BytesPerSecond, 1)
	assert.Equal(t, "ucx (UCX_TLS=tcp): 1000 × 1 MiB puts, window 64 × 1 write, allocated pools: 2.00 GB/s (1907 MiB/s) in 0.500 s (median of 3, 1.00 GB/s–4.00 GB/s)"+
		"; ucx_perftest (default buffers) 2.00 GB/s (1907 MiB/s) (2.00 GB/s–5.00 GB/s); ratio 0.80 (0.50–1.00)"+
		"; ucx_perftest (mmap,heap buffers) 2.00 GB/s (1907 MiB/s) (1.00 GB/s–4.00 GB/s); ratio 1.00 (0.50–2.00); 1 MiB verified", r.Line())
}

// TestParsePerftest reads what `ucx_perftest -f -v` printed (UCX 1.13.1,
// posix,self, 64 KiB), and refuses output whose columns do not agree.
func TestParsePerftest(t *testing.T) {
	out := []byte("+--- header noise\niterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n20000,0.671,0.885,0.885,70601.67,70601.67,1129627,1129627\n")
	bps, err := parsePerftest(out, 64<<10)
	require.NoError(t, err)
	assert.InDelta(t, 70601.67*(1<<20), bps, 1, "its MiB/s")
	assert.InDelta(t, 1129627*65536.0, bps, 0.01*bps, "= its message rate × size")

	// 4 MiB over TCP: 23 messages per second, rounded, is 2.7% above its
	// 93.94 MiB/s.
	slow := []byte("iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n128,100,42000,42000,93.94,93.94,23,23\n")
	bps, err = parsePerftest(slow, 4<<20)
	require.NoError(t, err)
	assert.InDelta(t, 93.94*(1<<20), bps, 1)

	_, err = parsePerftest(out, 1<<20)
	require.ErrorContains(t, err, "disagree", "the size is not the one that ran")
	_, err = parsePerftest([]byte("UCX ERROR client failed\n"), 64<<10)
	require.ErrorContains(t, err, "no figures")
	_, err = parsePerftest([]byte("iterations,overall_bw\n20000,x\n"), 64<<10)
	require.ErrorContains(t, err, "not a number")
	_, err = parsePerftest([]byte("iterations,overall_bw,overall_mr\n20000,1\n"), 64<<10)
	require.ErrorContains(t, err, "2 figures under 3 headings")
}

// scriptedEndpoint completes each batch inside Post (as instantEndpoint),
// with the error errAt gives for the post's number (from 1), or never
// when hold is set; post number failPost is refused.
type scriptedEndpoint struct {
	rdma.Endpoint
	posts    int
	failPost int
	errAt    func(post int) error
	hold     bool
}

func (e *scriptedEndpoint) Post(_ []rdma.Write, done func(error)) error {
	e.posts++
	if e.posts == e.failPost {
		return errors.New("refused by the test")
	}
	if !e.hold {
		var err error
		if e.errAt != nil {
			err = e.errAt(e.posts)
		}
		done(err)
	}
	return nil
}

// TestPutsFailures: a failed completion, a refused post and a context that
// ends with batches in flight each end the run with an error that says so,
// and nothing is posted after the failure is known or past the window.
func TestPutsFailures(t *testing.T) {
	cfg := Config{Transport: "loopback", Size: 4096, Count: 100, Slots: 1, Window: 4, WritesPerBatch: 1, Repeat: 1, Timeout: time.Minute}
	ep := &scriptedEndpoint{failPost: 3}
	rig := rigPostingTo(t, cfg, ep)
	ctx := context.Background()

	_, err := rig.Puts(ctx, 100)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "post of writes 2..2: refused by the test")
	assert.Equal(t, 3, ep.posts, "posted after a refused post")

	// The batches this run leaves in flight never complete: the runs
	// after it count from where it stopped.
	ep = &scriptedEndpoint{hold: true}
	rig.ep = ep
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = rig.Puts(cctx, 100)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "4 of 100 writes posted, 4 batches in flight")
	assert.Equal(t, 4, ep.posts, "posted past the window")

	lost := errors.New("lost by the test")
	ep = &scriptedEndpoint{errAt: func(post int) error {
		if post == 5 {
			return lost
		}
		return nil
	}}
	rig.ep = ep
	_, err = rig.Puts(ctx, 100)
	require.ErrorIs(t, err, lost)
	assert.Contains(t, err.Error(), "batch completion")
	assert.Equal(t, 5, ep.posts, "posted after a failed completion")

	_, err = rig.Puts(ctx, 100)
	require.ErrorIs(t, err, lost, "a rig whose batch failed is not reused")
}
