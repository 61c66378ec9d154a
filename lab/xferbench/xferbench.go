package xferbench

import (
	"context"
	"math/bits"
	"os"
	"runtime"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// Limits that keep a typo from asking for more memory than any host has, and
// the batches in flight (window entries, each a record on the transport's
// side) and the writes of one batch (the rig's write slice) bounded.
const (
	maxSize   = 1 << 30 // one write
	maxRegion = 4 << 30 // one region: slots × size
	maxWindow = 1 << 16
	maxBatch  = 1 << 16
)

// Config.Pool's values.
const (
	PoolAuto       = "auto"
	PoolAllocated  = "allocated"
	PoolRegistered = "registered"
)

// Config is one benchmark. Its fields are the flags of `kvstream bench
// transport`, and its errors name them so.
type Config struct {
	Transport      string // "loopback", or a kind Open knows
	Size           uint64 // bytes per write
	Count          int    // writes per timed run
	Window         int    // batches in flight at most
	WritesPerBatch int
	Slots          int // write i reads and writes slot i mod Slots
	Warmup         int // writes; negative means max(Count, one window)
	// WarmupFor repeats the untimed run of Warmup writes (and, with
	// Memcpy, its memcpy twin) until this much time has passed; zero
	// means one run. A virtual machine may take a few hundred
	// milliseconds of steady copying to reach the speed it keeps; short
	// runs after a single warm-up would then compare a cold transport
	// with a warm memcpy.
	WarmupFor time.Duration
	Repeat    int // timed runs
	Memcpy    bool
	Timeout   time.Duration // bound on the whole benchmark
	// Perftest also runs ucx_perftest ucp_put_bw (PerftestPath, default
	// "ucx_perftest") after every run, once per PerftestBuffers kind, with
	// the same size and count, and reports the ratios. UCX only.
	Perftest     bool
	PerftestPath string
	// Pool is where the source and destination regions come from:
	// PoolAllocated (the transports allocate them, rdma.Allocator),
	// PoolRegistered (hostmem blocks the rig registers), or PoolAuto ("",
	// allocated when both transports allocate).
	Pool string

	// Open opens one side of any transport other than loopback (the CLI
	// passes its registry, which also says when a binary lacks a kind).
	Open func(kind, name string) (rdma.Transport, error)

	// inspect, if set, sees the used source and destination bytes after
	// the last transport run, before they are freed, so that tests can
	// check the bytes themselves and not only the benchmark's own check.
	inspect func(src, dst []byte)
}

// validate checks the configuration, naming the bad value, before anything
// is opened or allocated; it caps Slots at Count and resolves a negative
// Warmup.
func (c *Config) validate() error {
	if c.Size == 0 {
		return errors.New("--size 0: must be positive")
	}
	if c.Size > maxSize {
		return errors.Newf("--size %s: at most %s", FormatBytes(c.Size), FormatBytes(maxSize))
	}
	for _, f := range []struct {
		name    string
		v, most int
	}{
		{"--count", c.Count, 1<<63 - 1},
		{"--window", c.Window, maxWindow},
		{"--writes-per-batch", c.WritesPerBatch, maxBatch},
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
	switch c.Pool {
	case "":
		c.Pool = PoolAuto
	case PoolAuto, PoolAllocated, PoolRegistered:
	default:
		return errors.Newf("--pool %q: want %s, %s or %s", c.Pool, PoolAuto, PoolAllocated, PoolRegistered)
	}
	if c.Perftest && c.Transport != "ucx" {
		return errors.Newf("--perftest: ucx_perftest measures UCX; use it with --transport ucx, not %q", c.Transport)
	}
	if c.PerftestPath == "" {
		c.PerftestPath = "ucx_perftest"
	}
	if c.Timeout <= 0 {
		return errors.Newf("--timeout %v: must be positive", c.Timeout)
	}
	if c.WarmupFor < 0 {
		return errors.Newf("--warmup-for %v: must not be negative", c.WarmupFor)
	}
	if c.WarmupFor >= c.Timeout {
		return errors.Newf("--warmup-for %v: must be shorter than --timeout %v", c.WarmupFor, c.Timeout)
	}
	if hi, _ := bits.Mul64(uint64(c.Count), c.Size); hi != 0 {
		return errors.Newf("--count %d × --size %s: more bytes than fit in 64 bits", c.Count, FormatBytes(c.Size))
	}
	if c.Slots > c.Count {
		c.Slots = c.Count // slots no write uses would only cost memory
	}
	if region := uint64(c.Slots) * c.Size; region > maxRegion {
		return errors.Newf("--slots %d × --size %s = %s per region: at most %s", c.Slots, FormatBytes(c.Size),
			FormatBytes(region), FormatBytes(maxRegion))
	}
	if c.Warmup < 0 {
		// A whole untimed run: connection setup, protocol selection,
		// UCX's internal pools and the pages of both regions settle before
		// the clock starts; a warm-up of one window leaves the first timed
		// run slower than the next.
		c.Warmup = max(c.Count, c.Window*c.WritesPerBatch)
	}
	return nil
}

// Run runs the whole benchmark: setup, warm-up, the timed runs with their
// checks, teardown.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
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
	defer func() { err = errors.CombineErrors(err, rig.Close()) }()

	rep = &Report{
		Transport: cfg.Transport, Size: cfg.Size, Count: cfg.Count, Window: cfg.Window,
		WritesPerBatch: cfg.WritesPerBatch, Slots: cfg.Slots, Warmup: cfg.Warmup, Repeat: cfg.Repeat,
		CPUs: runtime.NumCPU(), Bytes: uint64(cfg.Count) * cfg.Size, VerifiedBytes: uint64(cfg.Slots) * cfg.Size,
		Pool: rig.pool,
	}
	if cfg.Transport == "ucx" {
		rep.UCXTLS = os.Getenv("UCX_TLS")
		if rep.UCXTLS == "" {
			rep.UCXTLS = "all"
		}
	}

	// Warm up: connection setup, protocol selection, resident pages and
	// caches, and the machine itself (Config.WarmupFor), for both
	// contenders alike.
	if cfg.Warmup > 0 {
		start := time.Now()
		for rep.WarmupRuns == 0 || time.Since(start) < cfg.WarmupFor {
			if _, err := rig.Puts(ctx, cfg.Warmup); err != nil {
				return nil, errors.Wrapf(err, "warm-up run %d", rep.WarmupRuns+1)
			}
			if cfg.Memcpy {
				rig.Memcpy(cfg.Warmup)
			}
			rep.WarmupRuns++
		}
		rep.WarmupSeconds = time.Since(start).Seconds()
	}
	used := rig.used()
	for i := 0; i < cfg.Repeat; i++ {
		// Clear the destination so that the check below proves this run's
		// writes arrived, not the warm-up's or an earlier run's.
		clear(rig.dst.Bytes[:used])
		d, err := rig.Puts(ctx, cfg.Count)
		if err != nil {
			return nil, errors.Wrapf(err, "run %d", i+1)
		}
		if err := rig.Verify(); err != nil {
			return nil, errors.Wrapf(err, "run %d", i+1)
		}
		d = max(d, time.Nanosecond) // a clock that did not move must not print +Inf (invalid JSON)
		run := RunResult{Seconds: d.Seconds(), BytesPerSecond: float64(rep.Bytes) / d.Seconds()}
		if cfg.Memcpy {
			clear(rig.cpy.Bytes[:used]) // the same cache state as the transport's destination
			md := max(rig.Memcpy(cfg.Count), time.Nanosecond)
			run.MemcpySeconds, run.MemcpyBytesPerSecond = md.Seconds(), float64(rep.Bytes)/md.Seconds()
		}
		if cfg.Perftest {
			// Its own warm-up every time: a fresh pair of processes
			// connects, and pays what the transport paid in its warm-up.
			pt := perftestRun{path: cfg.PerftestPath, size: cfg.Size, count: cfg.Count,
				warmup: max(cfg.Count/10, cfg.Window*cfg.WritesPerBatch)}
			for _, kind := range PerftestBuffers {
				pt.allocPrio = kind.AllocPrio
				bps, err := pt.run(ctx)
				if err != nil {
					return nil, errors.Wrapf(err, "run %d: ucx_perftest with %s buffers", i+1, kind.Name)
				}
				run.PerftestBytesPerSecond = append(run.PerftestBytesPerSecond, bps)
			}
		}
		rep.Runs = append(rep.Runs, run)
	}
	if cfg.inspect != nil {
		cfg.inspect(rig.src.Bytes[:used], rig.dst.Bytes[:used])
	}
	rep.summarize(cfg.Memcpy, cfg.Perftest)
	return rep, nil
}
