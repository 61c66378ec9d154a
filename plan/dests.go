package plan

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
)

// destWork is one real destination's share of a plan: its page list and
// pool, and what destRuns found: an earlier destination with an equal list
// and pool (whose runs it shares), or its own runs, or its list's error.
type destWork struct {
	info     int // index in the spec's Infos
	pages    []int
	capacity int

	same int // index in the work of an earlier equal list, or -1
	runs []cp.Run
	err  error
}

// parallelPages is the fewest pages, over the page lists of a chunk's real
// destinations, that destRuns spreads over several goroutines: about 0.1 ms
// of work at the least, against the few µs of waking a goroutine.
const parallelPages = 1 << 17

// maxPlanWorkers bounds the goroutines of one plan.
const maxPlanWorkers = 8

// destRuns fills each destination's runs, or finds it an earlier
// destination with an equal list and pool: the decode ranks of one TP
// group hold the same page indices, each its share of the heads, and a
// chunk toward 32 of them is then one check and one coalescing, and 31
// compares, not 32 plans. The runs are shared, read-only, as a Route is.
//
// Each destination's work reads only the lists and the source side, so
// with more than parallelPages pages in all the destinations are spread
// over up to GOMAXPROCS goroutines (at most maxPlanWorkers), the caller's
// included, which all end before destRuns returns: the registration of a
// large chunk takes the time of its largest share, not of the sum, and
// costs as much CPU as before (docs/PERFORMANCE.md).
func destRuns(source *cp.Source, work []destWork) {
	total := 0
	for _, w := range work {
		total += len(w.pages)
	}
	workers := min(runtime.GOMAXPROCS(0), maxPlanWorkers, len(work))
	if total < parallelPages || workers < 2 {
		for k := range work {
			destRun(source, work, k)
		}
		return
	}
	var next atomic.Int64
	run := func() {
		for {
			k := int(next.Add(1) - 1)
			if k >= len(work) {
				return
			}
			destRun(source, work, k)
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(run)
	}
	run()
	wg.Wait()
}

// destRun does destination k's work: it reads the earlier destinations'
// lists but writes only work[k].
func destRun(source *cp.Source, work []destWork, k int) {
	w := &work[k]
	w.same = -1
	// A bug in the check of a page list must fail the registration, not
	// the process: on a goroutine of destRuns' own no caller's recover
	// would see it.
	defer func() {
		if r := recover(); r != nil {
			w.same, w.runs, w.err = -1, nil, errors.AssertionFailedf("info %d: planning its destination pages panicked (a bug): %v", w.info, r)
		}
	}()
	for j := range k {
		if work[j].capacity == w.capacity && equalPages(work[j].pages, w.pages) {
			// The first equal one: it is no copy of an earlier one itself
			// (that one would equal w too), so it holds the runs.
			w.same = j
			return
		}
	}
	w.runs, w.err = source.CheckedRuns(w.pages, w.capacity)
}
