package xferbench

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

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
		{func(c *Config) { c.Transport = "ucx" }, `--transport "ucx": only loopback is built in, and no opener was given for it`},
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
		VerifiedBytes: 64 << 10, Runs: []RunResult{{Seconds: 1e-3, BytesPerSecond: 4 * 64 << 10 * 1e3}, {Seconds: 3e-3, BytesPerSecond: 4 * 64 << 10 * 1e3 / 3}}}
	r.summarize(false)
	assert.InDelta(t, 2e-3, r.Seconds, 1e-12, "the median of two runs is their mean")
	assert.Equal(t, "loopback: 4 × 64 KiB puts, window 2 × 2 writes: 0.13 GB/s (125 MiB/s) in 0.002 s (median of 2, 0.09 GB/s–0.26 GB/s); 64 KiB verified", r.Line())
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

// TestPostLoopAllocatesNothing: the posting loop adds no allocation of
// its own to what the transport's Post costs.
func TestPostLoopAllocatesNothing(t *testing.T) {
	cfg := Config{Transport: "loopback", Size: 4096, Count: 1000, Slots: 7, Window: 8, WritesPerBatch: 3, Repeat: 1, Timeout: time.Minute}
	rig, err := OpenRig(cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, rig.Close()) }()
	orig := rig.ep
	rig.ep = instantEndpoint{}
	defer func() { rig.ep = orig }()
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
