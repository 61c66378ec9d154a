package scalebench

import (
	"runtime"
	"syscall"
	"time"
)

// loopResult is a timed loop's figures per operation.
type loopResult struct {
	n      int
	ns     float64 // wall time per operation
	allocs float64 // heap allocations per operation, by every goroutine
}

// timeLoop runs fn(n) with n growing tenfold from minN until one run takes
// at least budget/4, then once more with n scaled to take about budget, at
// most maxN (testing.B's scheme, with its own budget). Allocations are the
// process's (runtime.MemStats.Mallocs), so they include what other
// goroutines did because of fn.
func timeLoop(budget time.Duration, minN, maxN int, fn func(n int) error) (loopResult, error) {
	n := max(minN, 1)
	for {
		r, err := timeOnce(n, fn)
		if err != nil {
			return r, err
		}
		took := time.Duration(r.ns * float64(n))
		if took >= budget/4 || n >= maxN {
			if took >= budget || n >= maxN {
				return r, nil
			}
			next := int(float64(n) * float64(budget) / float64(max(took, 1)))
			return timeOnce(min(max(next, n+1), maxN), fn)
		}
		n = min(n*10, maxN)
	}
}

func timeOnce(n int, fn func(n int) error) (loopResult, error) {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	err := fn(n)
	took := time.Since(start)
	runtime.ReadMemStats(&m1)
	return loopResult{n: n, ns: float64(took.Nanoseconds()) / float64(n), allocs: float64(m1.Mallocs-m0.Mallocs) / float64(n)}, err
}

// cpuTime is the CPU time this process used so far (user and system), every
// thread's.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapInUse is the live heap after full collections, once it settled: an
// engine closed just before still frees what its goroutines held for a
// while, so collections run until two in a row agree within 1 KiB (at most
// 50, a millisecond apart).
func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	last := m.HeapAlloc
	for i := 0; i < 50; i++ {
		time.Sleep(time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&m)
		if m.HeapAlloc+1024 > last && last+1024 > m.HeapAlloc {
			return m.HeapAlloc
		}
		last = m.HeapAlloc
	}
	return last
}
