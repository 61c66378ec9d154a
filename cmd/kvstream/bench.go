package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/spf13/cobra"
)

// newBench is `kvstream bench`, the parent of the data-path benchmarks.
func newBench() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure kvstream's data path",
		Long:  "bench measures parts of kvstream's data path in isolation; see `kvstream bench transport`.",
	}
	cmd.AddCommand(newBenchTransport())
	return cmd
}

// Limits that keep a typo from asking for more memory than any host has, and
// keep the completion channel (window entries) small.
const (
	maxBenchSize   = 1 << 30 // one write
	maxBenchRegion = 4 << 30 // one region: slots × size
	maxBenchWindow = 1 << 16
	maxBenchBatch  = 1 << 16
)

// newBenchTransport is `kvstream bench transport`.
func newBenchTransport() *cobra.Command {
	cfg := benchConfig{Size: 1 << 20}
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "transport",
		Short: "Measure put bandwidth through the engine's transport (loopback or ucx)",
		Long: `transport measures what the engine's submitters get from a transport: it opens a sender and
its own target side in this process (loopback: two nodes of a fresh fabric; ucx: two UCX
transports), registers hostmem source and destination regions, connects, imports the destination,
and posts --count writes of --size bytes through rdma.Endpoint.Post, --writes-per-batch writes per
batch with up to --window batches in flight. A batch counts when its completion reports the bytes
visible at the destination (UCX: after its flush). The clock runs from the first post to the last
completion. A warm-up of the same shape (--count writes, at least one window) runs first, untimed:
on this project's VMs UCX's first run after connecting was measured at half the speed of the next.

Write i reads source slot i mod --slots and writes the same destination slot. The default, one
slot, is ucx_perftest's layout (every put covers the same buffer); more slots spread the writes
over more memory, as KV pages are. After every run the destination slots are compared with the
source (they are cleared before the run), so a run that measured nothing fails.

--memcpy also times a plain memcpy of the same bytes (same sizes, same count, same slots, between
two hostmem blocks), alternating with the transport runs, and reports the ratio (the project
target is loopback ≥ 0.8× memcpy). --repeat runs both that many times and reports medians and
ranges. UCX reads UCX_TLS and its other UCX_* variables from the environment.`,
		Example: `  kvstream bench transport --transport loopback --size 1M --count 2000 --memcpy --repeat 5
  UCX_TLS=tcp kvstream bench transport --transport ucx --size 64K --count 20000 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case !cmd.Flags().Changed("warmup"):
				cfg.Warmup = -1 // one untimed run
			case cfg.Warmup < 0:
				return errors.Newf("--warmup %d: must not be negative", cfg.Warmup)
			}
			rep, err := runBench(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if jsonOut {
				enc := json.NewEncoder(cmd.OutOrStdout())
				return enc.Encode(rep)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), rep.line())
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Transport, "transport", "loopback", "transport to measure: loopback, or ucx in a binary built with -tags ucx")
	fl.Var((*byteSize)(&cfg.Size), "size", "bytes per write; suffixes K, M, G (also KiB/KB, …: all powers of 1024), e.g. 64K, 1M, 4MiB")
	fl.IntVar(&cfg.Count, "count", 1000, "writes to time")
	fl.IntVar(&cfg.Window, "window", 64, "batches in flight at most")
	fl.IntVar(&cfg.WritesPerBatch, "writes-per-batch", 1, "writes per posted batch (the engine posts a group's blocks as one batch)")
	fl.IntVar(&cfg.Slots, "slots", 1, "source and destination slots of --size bytes; write i uses slot i mod slots")
	fl.IntVar(&cfg.Warmup, "warmup", 0, "untimed writes first (default: --count, at least window × writes-per-batch)")
	fl.IntVar(&cfg.Repeat, "repeat", 1, "timed runs (alternating with memcpy runs under --memcpy); medians are reported")
	fl.BoolVar(&cfg.Memcpy, "memcpy", false, "also time a plain memcpy of the same bytes and report the ratio")
	fl.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "give up (and fail) when the whole benchmark takes longer")
	fl.BoolVar(&jsonOut, "json", false, "print the report as one JSON object")
	return cmd
}

// benchConfig is one `bench transport` invocation.
type benchConfig struct {
	Transport      string
	Size           uint64
	Count          int
	Window         int
	WritesPerBatch int
	Slots          int
	Warmup         int // writes; negative means max(Count, one window)
	Repeat         int
	Memcpy         bool
	Timeout        time.Duration

	// inspect, if set, sees the used source and destination bytes after
	// the last transport run, before they are freed, so that tests can
	// check the bytes themselves and not only the benchmark's own check.
	inspect func(src, dst []byte)
}

// validate checks the flags, naming the bad value, before anything is
// opened or allocated.
func (c *benchConfig) validate() error {
	if c.Size == 0 {
		return errors.New("--size 0: must be positive")
	}
	if c.Size > maxBenchSize {
		return errors.Newf("--size %s: at most %s", formatBytes(c.Size), formatBytes(maxBenchSize))
	}
	for _, f := range []struct {
		name    string
		v, most int
	}{
		{"--count", c.Count, 1<<63 - 1},
		{"--window", c.Window, maxBenchWindow},
		{"--writes-per-batch", c.WritesPerBatch, maxBenchBatch},
		{"--slots", c.Slots, 1<<63 - 1},
		{"--repeat", c.Repeat, 1 << 20},
	} {
		if f.v <= 0 {
			return errors.Newf("%s %d: must be positive", f.name, f.v)
		}
		if f.v > f.most {
			return errors.Newf("%s %d: at most %d", f.name, f.v, f.most)
		}
	}
	if c.Timeout <= 0 {
		return errors.Newf("--timeout %v: must be positive", c.Timeout)
	}
	if hi, _ := bits.Mul64(uint64(c.Count), c.Size); hi != 0 {
		return errors.Newf("--count %d × --size %s: more bytes than fit in 64 bits", c.Count, formatBytes(c.Size))
	}
	if c.Slots > c.Count {
		c.Slots = c.Count // slots no write uses would only cost memory
	}
	if region := uint64(c.Slots) * c.Size; region > maxBenchRegion {
		return errors.Newf("--slots %d × --size %s = %s per region: at most %s", c.Slots, formatBytes(c.Size),
			formatBytes(region), formatBytes(maxBenchRegion))
	}
	if c.Warmup < 0 {
		// A whole untimed run: connection setup, protocol selection,
		// UCX's internal pools and the pages of both regions settle before
		// the clock starts. One window was not enough (the first timed run
		// over shared memory came out at 2.4 GB/s, the next ones at 6).
		c.Warmup = max(c.Count, c.Window*c.WritesPerBatch)
	}
	return nil
}

// benchReport is the result; its JSON is what --json prints.
type benchReport struct {
	Transport      string `json:"transport"`
	UCXTLS         string `json:"ucx_tls,omitempty"` // UCX_TLS as UCX reads it ("all" when unset)
	Size           uint64 `json:"size"`
	Count          int    `json:"count"`
	Window         int    `json:"window"`
	WritesPerBatch int    `json:"writes_per_batch"`
	Slots          int    `json:"slots"`
	Warmup         int    `json:"warmup"`
	Repeat         int    `json:"repeat"`
	CPUs           int    `json:"cpus"`
	Bytes          uint64 `json:"bytes"` // per run: count × size
	// Seconds is the median run's; BytesPerSecond is Bytes over it.
	Seconds           float64 `json:"seconds"`
	BytesPerSecond    float64 `json:"bytes_per_second"`
	BytesPerSecondMin float64 `json:"bytes_per_second_min"`
	BytesPerSecondMax float64 `json:"bytes_per_second_max"`
	// VerifiedBytes are the distinct destination bytes compared with the
	// source after every run: min(count, slots) × size.
	VerifiedBytes uint64 `json:"verified_bytes"`

	MemcpySeconds           float64 `json:"memcpy_seconds,omitempty"`
	MemcpyBytesPerSecond    float64 `json:"memcpy_bytes_per_second,omitempty"`
	MemcpyBytesPerSecondMin float64 `json:"memcpy_bytes_per_second_min,omitempty"`
	MemcpyBytesPerSecondMax float64 `json:"memcpy_bytes_per_second_max,omitempty"`
	// RatioToMemcpy is the median over runs of transport / memcpy bandwidth
	// of the same run: pairing the runs cancels slow drifts of a noisy
	// machine better than a ratio of medians.
	RatioToMemcpy float64 `json:"ratio_to_memcpy,omitempty"`

	Runs []benchRun `json:"runs"`
}

// benchRun is one timed run (and its memcpy twin).
type benchRun struct {
	Seconds              float64 `json:"seconds"`
	BytesPerSecond       float64 `json:"bytes_per_second"`
	MemcpySeconds        float64 `json:"memcpy_seconds,omitempty"`
	MemcpyBytesPerSecond float64 `json:"memcpy_bytes_per_second,omitempty"`
}

// line is the report as one readable line.
func (r *benchReport) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", r.Transport)
	if r.UCXTLS != "" {
		fmt.Fprintf(&b, " (UCX_TLS=%s)", r.UCXTLS)
	}
	batch := "write"
	if r.WritesPerBatch > 1 {
		batch = "writes"
	}
	fmt.Fprintf(&b, ": %d × %s puts, window %d × %d %s: %s in %.3f s", r.Count, formatBytes(r.Size), r.Window,
		r.WritesPerBatch, batch, formatRate(r.BytesPerSecond), r.Seconds)
	if r.Repeat > 1 {
		fmt.Fprintf(&b, " (median of %d, %s–%s)", r.Repeat, formatGBs(r.BytesPerSecondMin), formatGBs(r.BytesPerSecondMax))
	}
	if r.MemcpyBytesPerSecond > 0 {
		fmt.Fprintf(&b, "; memcpy %s", formatRate(r.MemcpyBytesPerSecond))
		if r.Repeat > 1 {
			fmt.Fprintf(&b, " (%s–%s)", formatGBs(r.MemcpyBytesPerSecondMin), formatGBs(r.MemcpyBytesPerSecondMax))
		}
		fmt.Fprintf(&b, "; ratio %.2f", r.RatioToMemcpy)
	}
	fmt.Fprintf(&b, "; %s verified", formatBytes(r.VerifiedBytes))
	return b.String()
}

// runBench runs the whole benchmark: setup, warm-up, the timed runs with
// their checks, teardown.
func runBench(ctx context.Context, cfg benchConfig) (rep *benchReport, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	rig, err := openRig(cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.CombineErrors(err, rig.close()) }()

	rep = &benchReport{
		Transport: cfg.Transport, Size: cfg.Size, Count: cfg.Count, Window: cfg.Window,
		WritesPerBatch: cfg.WritesPerBatch, Slots: cfg.Slots, Warmup: cfg.Warmup, Repeat: cfg.Repeat,
		CPUs: runtime.NumCPU(), Bytes: uint64(cfg.Count) * cfg.Size, VerifiedBytes: uint64(cfg.Slots) * cfg.Size,
	}
	if cfg.Transport == "ucx" {
		rep.UCXTLS = os.Getenv("UCX_TLS")
		if rep.UCXTLS == "" {
			rep.UCXTLS = "all"
		}
	}

	// Warm up: connection setup, protocol selection, resident pages and
	// caches, for both contenders alike.
	if cfg.Warmup > 0 {
		if _, err := rig.puts(ctx, cfg.Warmup); err != nil {
			return nil, errors.Wrap(err, "warm-up")
		}
		if cfg.Memcpy {
			rig.memcpy(cfg.Warmup)
		}
	}
	used := rig.used()
	for i := 0; i < cfg.Repeat; i++ {
		// Clear the destination so that the check below proves this run's
		// writes arrived, not the warm-up's or an earlier run's.
		clear(rig.dst.Bytes[:used])
		d, err := rig.puts(ctx, cfg.Count)
		if err != nil {
			return nil, errors.Wrapf(err, "run %d", i+1)
		}
		if err := rig.verify(); err != nil {
			return nil, errors.Wrapf(err, "run %d", i+1)
		}
		d = max(d, time.Nanosecond) // a clock that did not move must not print +Inf (invalid JSON)
		run := benchRun{Seconds: d.Seconds(), BytesPerSecond: float64(rep.Bytes) / d.Seconds()}
		if cfg.Memcpy {
			clear(rig.cpy.Bytes[:used]) // the same cache state as the transport's destination
			md := max(rig.memcpy(cfg.Count), time.Nanosecond)
			run.MemcpySeconds, run.MemcpyBytesPerSecond = md.Seconds(), float64(rep.Bytes)/md.Seconds()
		}
		rep.Runs = append(rep.Runs, run)
	}
	if cfg.inspect != nil {
		cfg.inspect(rig.src.Bytes[:used], rig.dst.Bytes[:used])
	}
	rep.summarize(cfg.Memcpy)
	return rep, nil
}

// summarize fills the medians and ranges from the runs, the memcpy ones
// too when there are.
func (r *benchReport) summarize(memcpy bool) {
	pick := func(f func(benchRun) float64) []float64 {
		v := make([]float64, len(r.Runs))
		for i, run := range r.Runs {
			v[i] = f(run)
		}
		sort.Float64s(v)
		return v
	}
	secs := pick(func(x benchRun) float64 { return x.Seconds })
	r.Seconds = median(secs)
	r.BytesPerSecond = float64(r.Bytes) / r.Seconds
	r.BytesPerSecondMin, r.BytesPerSecondMax = float64(r.Bytes)/secs[len(secs)-1], float64(r.Bytes)/secs[0]
	if !memcpy {
		return
	}
	msecs := pick(func(x benchRun) float64 { return x.MemcpySeconds })
	r.MemcpySeconds = median(msecs)
	r.MemcpyBytesPerSecond = float64(r.Bytes) / r.MemcpySeconds
	r.MemcpyBytesPerSecondMin, r.MemcpyBytesPerSecondMax = float64(r.Bytes)/msecs[len(msecs)-1], float64(r.Bytes)/msecs[0]
	r.RatioToMemcpy = median(pick(func(x benchRun) float64 { return x.BytesPerSecond / x.MemcpyBytesPerSecond }))
}

// median of sorted values.
func median(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// benchRig is the sender, its target side and the memory between them.
type benchRig struct {
	cfg           benchConfig
	from, to      rdma.Transport
	src, dst, cpy *hostmem.Block // cpy: memcpy's destination, unregistered
	local         rdma.LocalKey
	remote        rdma.RemoteKey
	ep            rdma.Endpoint

	// Reused by every run, so that the posting loop allocates nothing of
	// its own: the transport's Post is all that is measured.
	ws   []rdma.Write
	done chan error
	cb   func(error)
}

// openRig opens both sides and the memory. On error it releases what it
// had opened.
func openRig(cfg benchConfig) (_ *benchRig, err error) {
	r := &benchRig{cfg: cfg, ws: make([]rdma.Write, cfg.WritesPerBatch), done: make(chan error, cfg.Window)}
	// The channel holds one completion per batch in flight, so done never
	// blocks the transport's goroutine (UCX runs it on its progress loop).
	r.cb = func(err error) { r.done <- err }
	if r.from, r.to, err = openPair(cfg.Transport); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.CombineErrors(err, r.close())
		}
	}()
	region := int(uint64(cfg.Slots) * cfg.Size)
	if r.src, err = hostmem.Alloc(region); err != nil {
		return nil, errors.Wrap(err, "source region")
	}
	fillPattern(r.src.Bytes)
	if r.dst, err = hostmem.Alloc(region); err != nil {
		return nil, errors.Wrap(err, "destination region")
	}
	if cfg.Memcpy {
		if r.cpy, err = hostmem.Alloc(region); err != nil {
			return nil, errors.Wrap(err, "memcpy destination")
		}
	}
	sreg, err := r.from.Register(r.src.Addr, uint64(region))
	if err != nil {
		return nil, errors.Wrap(err, "register the source")
	}
	r.local = sreg.Key()
	dreg, err := r.to.Register(r.dst.Addr, uint64(region))
	if err != nil {
		return nil, errors.Wrap(err, "register the destination")
	}
	if r.ep, err = r.from.Connect(r.to.Address()); err != nil {
		return nil, errors.Wrap(err, "connect to the target side")
	}
	if r.remote, err = r.ep.Import(dreg.Desc()); err != nil {
		return nil, errors.Wrap(err, "import the destination")
	}
	return r, nil
}

// openPair opens the sender and the target side. Loopback gets a fabric of
// its own rather than the process's default, so that runs (and tests in one
// process) cannot meet each other's nodes; every other kind goes through
// the CLI's registry, which also says when this binary lacks it.
func openPair(kind string) (from, to rdma.Transport, err error) {
	if kind == "loopback" {
		fab := loopback.NewFabric(loopback.Options{})
		f, err := fab.NewTransport("bench-prefill")
		if err != nil {
			return nil, nil, err
		}
		t, err := fab.NewTransport("bench-decode")
		if err != nil {
			return nil, nil, errors.CombineErrors(err, f.Close())
		}
		return f, t, nil
	}
	if from, err = openTransport(kind, "bench-prefill"); err != nil {
		return nil, nil, err
	}
	if to, err = openTransport(kind, "bench-decode"); err != nil {
		return nil, nil, errors.CombineErrors(errors.Wrap(err, "target side"), from.Close())
	}
	return from, to, nil
}

// close tears down in the order that keeps the memory safe: the endpoint
// (it drains), both transports (no worker can apply a write any more), and
// only then the memory they had registered.
func (r *benchRig) close() error {
	var err error
	if r.ep != nil {
		err = errors.CombineErrors(err, errors.Wrap(r.ep.Close(), "close the endpoint"))
	}
	for _, t := range []rdma.Transport{r.from, r.to} {
		if t != nil {
			err = errors.CombineErrors(err, errors.Wrapf(t.Close(), "close %s", t.Name()))
		}
	}
	for _, b := range []*hostmem.Block{r.src, r.dst, r.cpy} {
		if b != nil {
			err = errors.CombineErrors(err, b.Free())
		}
	}
	return err
}

// used is the number of bytes of each region that writes touch.
func (r *benchRig) used() int { return r.cfg.Slots * int(r.cfg.Size) }

// puts posts n writes, WritesPerBatch per batch with up to Window batches in
// flight, and waits for every completion. It returns the time from the
// first post to the last completion. It allocates nothing itself.
func (r *benchRig) puts(ctx context.Context, n int) (time.Duration, error) {
	size, slots, wpb := r.cfg.Size, r.cfg.Slots, r.cfg.WritesPerBatch
	inflight, slot := 0, 0
	var failed error
	start := time.Now()
	for next := 0; next < n && failed == nil; {
		if inflight == r.cfg.Window {
			select {
			case err := <-r.done:
				inflight--
				if err != nil {
					failed = errors.Wrap(err, "batch completion")
				}
			case <-ctx.Done():
				return 0, errors.Wrapf(ctx.Err(), "%d of %d writes posted, %d batches in flight", next, n, inflight)
			}
			continue
		}
		k := min(wpb, n-next)
		for j := range k {
			off := uint64(slot) * size
			r.ws[j] = rdma.Write{Src: r.src.Addr + off, Dst: r.dst.Addr + off, Len: size, Local: r.local, Remote: r.remote}
			if slot++; slot == slots {
				slot = 0
			}
		}
		if err := r.ep.Post(r.ws[:k], r.cb); err != nil {
			failed = errors.Wrapf(err, "post of writes %d..%d", next, next+k-1)
			break
		}
		inflight++
		next += k
	}
	for ; inflight > 0; inflight-- {
		select {
		case err := <-r.done:
			if err != nil && failed == nil {
				failed = errors.Wrap(err, "batch completion")
			}
		case <-ctx.Done():
			// The caller closes the endpoint, which fails what is left;
			// the channel has room for all of it.
			return 0, errors.Wrapf(ctx.Err(), "waiting for %d batches in flight", inflight)
		}
	}
	elapsed := time.Since(start)
	if failed != nil {
		return 0, failed
	}
	return elapsed, nil
}

// memcpy copies n slots from the source to memcpy's own destination with
// the transport runs' layout, and times it.
func (r *benchRig) memcpy(n int) time.Duration {
	size, slots := int(r.cfg.Size), r.cfg.Slots
	src, dst := r.src.Bytes, r.cpy.Bytes
	slot := 0
	start := time.Now()
	for range n {
		off := slot * size
		copy(dst[off:off+size], src[off:off+size])
		if slot++; slot == slots {
			slot = 0
		}
	}
	return time.Since(start)
}

// verify compares every used destination slot with its source slot.
func (r *benchRig) verify() error {
	used := r.used()
	src, dst := r.src.Bytes[:used], r.dst.Bytes[:used]
	if bytes.Equal(src, dst) {
		return nil
	}
	i := 0
	for i < used && src[i] == dst[i] {
		i++
	}
	size := int(r.cfg.Size)
	return errors.Newf("destination slot %d differs from its source at byte %d (got %#02x, want %#02x): the writes did not all arrive",
		i/size, i%size, dst[i], src[i])
}

// fillPattern fills b with a xorshift sequence: no two slots are equal and
// no slot is zero, so a write that landed in the wrong slot, or not at all,
// shows.
func fillPattern(b []byte) {
	x := uint64(0x9e3779b97f4a7c15)
	for i := range b {
		if i%8 == 0 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
		b[i] = byte(x >> (8 * (i % 8)))
	}
}

// byteSize is a flag value in bytes that accepts binary suffixes.
type byteSize uint64

// String prints the value the way Set accepts it.
func (s *byteSize) String() string { return formatBytes(uint64(*s)) }

// Type names the flag's kind in usage.
func (s *byteSize) Type() string { return "size" }

// Set parses a size; pflag puts the flag name and the value in front of the
// error.
func (s *byteSize) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = byteSize(n)
	return nil
}

// parseSize parses "65536", "64K", "64KiB", "1M", "4MiB", "1G": all
// suffixes are powers of 1024 (KB too, as memory sizes are).
func parseSize(v string) (uint64, error) {
	s := strings.TrimSpace(v)
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, errors.Newf("size %q: want a number of bytes with an optional suffix K, M or G (e.g. 64K, 1M, 4MiB)", v)
	}
	n, err := strconv.ParseUint(s[:i], 10, 64)
	if err != nil {
		return 0, errors.Newf("size %q: %s", v, err.(*strconv.NumError).Err)
	}
	var shift uint
	switch strings.ToLower(strings.TrimSpace(s[i:])) {
	case "", "b":
	case "k", "kb", "ki", "kib":
		shift = 10
	case "m", "mb", "mi", "mib":
		shift = 20
	case "g", "gb", "gi", "gib":
		shift = 30
	default:
		return 0, errors.Newf("size %q: unknown suffix %q (use K, M or G, e.g. 64K, 1M, 4MiB)", v, s[i:])
	}
	if n == 0 {
		return 0, errors.Newf("size %q: must be positive", v)
	}
	if n > (1<<64-1)>>shift {
		return 0, errors.Newf("size %q: too large", v)
	}
	return n << shift, nil
}

// formatBytes prints n with the largest binary unit that divides it.
func formatBytes(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// formatRate prints a bandwidth in GB/s and, for comparison with
// ucx_perftest (whose "MB/s" are 2^20 bytes per second), in MiB/s.
func formatRate(bps float64) string {
	return fmt.Sprintf("%s (%.0f MiB/s)", formatGBs(bps), bps/(1<<20))
}

func formatGBs(bps float64) string { return fmt.Sprintf("%.2f GB/s", bps/1e9) }
