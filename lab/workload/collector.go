package workload

import (
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
)

// collector observes one mode's run.
type collector struct {
	system.NopObserver
	mu       sync.Mutex
	batches  []system.Batch
	kernels  map[string]sim.Span            // by name; the latest end when several streams run it
	byStream map[string]map[string]sim.Span // by stream (a prefill rank's), then name
	order    []string
	finishes []finishRec
	// resent and resumed count the Works re-sent after a broken batch and
	// the chunks that succeeded after re-sending, every rank's.
	resent, resumed int
}

func newCollector() *collector {
	return &collector{kernels: map[string]sim.Span{}, byStream: map[string]map[string]sim.Span{}}
}

type finishRec struct {
	room      int
	forward   int // the chunk's forward (plan.forwards)
	chunk     system.Chunk
	call, ret time.Time
	status    system.Status
	stats     system.ChunkStats
	ok        bool // the Finish succeeded
}

func (c *collector) Batch(b system.Batch) {
	c.mu.Lock()
	c.batches = append(c.batches, b)
	c.mu.Unlock()
}
func (c *collector) Chunk(r system.Result) {
	if r.Stats.Resent == 0 {
		return
	}
	c.mu.Lock()
	c.resent += r.Stats.Resent
	if r.Status == system.Succeeded {
		c.resumed++
	}
	c.mu.Unlock()
}

func (c *collector) resumes() (resent, resumed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resent, c.resumed
}
func (c *collector) span(s sim.Span) {
	c.mu.Lock()
	if old, ok := c.kernels[s.Name]; !ok || s.End.After(old.End) {
		if !ok {
			c.order = append(c.order, s.Name)
		}
		c.kernels[s.Name] = s
	}
	if c.byStream[s.Stream] == nil {
		c.byStream[s.Stream] = map[string]sim.Span{}
	}
	c.byStream[s.Stream][s.Name] = s
	c.mu.Unlock()
}

// forwardEnds returns the end of each of the first forwards forwards: its
// last kernel's on the latest prefill rank. They are read after the run
// from the spans, not waited for during it: the forward loop runs ahead of
// the GPU (see runRig).
func (c *collector) forwardEnds(ranks []*rank, forwards int) ([]time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ends := make([]time.Time, forwards)
	for k := range ends {
		for _, rk := range ranks {
			s, ok := c.byStream[rk.stream.Name()][testbed.KernelName(k+1, rk.lastLocal)]
			if !ok {
				return nil, errors.AssertionFailedf("forward %d: no span for %s's last kernel", k+1, rk.stream.Name())
			}
			if s.End.After(ends[k]) {
				ends[k] = s.End
			}
		}
	}
	return ends, nil
}
