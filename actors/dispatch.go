package actors

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Dispatcher runs actor mailboxes (and the chunk hosts' activations) on a
// fixed set of worker goroutines.
//
// protoactor's default dispatcher starts a goroutine each time an idle
// mailbox gets a message; handing the mailbox to a waiting worker is
// cheaper, on the forward thread above all. What runs on the engine's
// instance (the manager's mailbox, the hosts stepping rooms and chunks)
// must never block: it only computes, sends, and answers on buffered
// channels; a full queue falls back to a fresh goroutine rather than stall
// the forward thread. The submitter pool has an
// instance of its own, one worker per submitter. Long-lived workers also
// keep the stacks they grew: a goroutine started per activation grows its
// stack again on every deep call.
type Dispatcher struct {
	work   chan func()
	quit   chan struct{}
	closed atomic.Bool
	wg     sync.WaitGroup
	once   sync.Once
}

var _ actor.Dispatcher = (*Dispatcher)(nil)

// NewDispatcher starts workers (0 means GOMAXPROCS).
func NewDispatcher(workers int) *Dispatcher {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	d := &Dispatcher{work: make(chan func(), 4096), quit: make(chan struct{})}
	d.wg.Add(workers)
	for i := 0; i < workers; i++ {
		go func() {
			defer d.wg.Done()
			for {
				select {
				case fn := <-d.work:
					fn()
				case <-d.quit:
					return
				}
			}
		}()
	}
	return d
}

// Schedule runs fn on a worker. After Close (a transport completion can
// still reach a chunk that is stopping) it runs fn on its own goroutine.
func (d *Dispatcher) Schedule(fn func()) {
	if d.closed.Load() {
		go fn()
		return
	}
	select {
	case d.work <- fn:
	default:
		go fn()
	}
}

// Throughput is how many messages a mailbox handles before yielding.
func (d *Dispatcher) Throughput() int { return 300 }

// Close stops the workers after running what is queued.
func (d *Dispatcher) Close() {
	d.once.Do(func() {
		d.closed.Store(true)
		close(d.quit)
		d.wg.Wait()
		for {
			select {
			case fn := <-d.work:
				fn()
			default:
				return
			}
		}
	})
}
